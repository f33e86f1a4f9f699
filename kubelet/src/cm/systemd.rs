//! The systemd cgroup driver (`cgroupDriver: systemd`), as upstream's
//! container manager drives it through runc's libcontainer: every cgroup of
//! the pods' tree is a slice unit, named from its cgroup name's parts joined
//! with `-` (a `-` inside a part becomes `_`), made by systemd as a transient
//! unit over its D-Bus API (`StartTransientUnit`, or `SetUnitProperties` when
//! it exists) with the limits as unit properties, and stopped (`StopUnit`)
//! when its pod is gone. systemd writes the cgroup files; evlet writes none.
//!
//! The names (pure): `["kubepods", "burstable", "pod<uid>"]` is the unit
//! `kubepods-burstable-pod<uid>.slice` at
//! `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`
//! (upstream's `CgroupName.ToSystemd`, libcontainer's `ExpandSlice`). That
//! path is also the sandbox's `cgroup_parent`: the runtime (containerd with
//! `SystemdCgroup = true`) takes its last slice and puts each container in a
//! `cri-containerd-<id>.scope` there.
//!
//! Only pure cgroup v2 is driven (the unit properties written are v2's:
//! `CPUWeight`, `CPUQuotaPerSecUSec`, `MemoryMax`, `TasksMax`); the agent
//! refuses the driver on a v1 or hybrid host.

use std::time::Duration;

use futures_util::StreamExt as _;
use zbus::zvariant::{OwnedObjectPath, Value};

use super::limits::{self, Limits};

/// How long a unit's job may take.
const JOB_TIMEOUT: Duration = Duration::from_secs(30);

/// systemd's error when a transient unit's name is taken.
const UNIT_EXISTS: &str = "org.freedesktop.systemd1.UnitExists";
/// systemd's error when a unit to stop is not loaded.
const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";

/// A cgroup name part as a slice name part (upstream's
/// `escapeSystemdCgroupName`).
fn escape(part: &str) -> String {
    part.replace('-', "_")
}

/// The slice unit of the cgroup named by `parts`; `-.slice` (the root) for
/// none.
pub fn slice_name<S: AsRef<str>>(parts: &[S]) -> String {
    if parts.is_empty() {
        return "-.slice".to_owned();
    }
    let joined: Vec<String> = parts.iter().map(|p| escape(p.as_ref())).collect();
    format!("{}.slice", joined.join("-"))
}

/// Where systemd puts the slice of the cgroup named by `parts`: each prefix's
/// slice inside the one before (`/` for none).
pub fn slice_path<S: AsRef<str>>(parts: &[S]) -> String {
    if parts.is_empty() {
        return "/".to_owned();
    }
    let mut path = String::new();
    for n in 1..=parts.len() {
        path.push('/');
        path.push_str(&slice_name(&parts[..n]));
    }
    path
}

/// The unit of a slice path made by [`slice_path`]: its last component.
pub fn unit_of(path: &str) -> &str {
    path.rsplit('/')
        .find(|p| !p.is_empty())
        .unwrap_or("-.slice")
}

/// What one property of a unit is set to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Property {
    /// A string (`Description`).
    Str(String),
    /// A boolean (accounting, dependencies).
    Bool(bool),
    /// An unsigned 64-bit number (limits).
    U64(u64),
}

/// `props` as D-Bus `(sv)` pairs.
fn values<'a>(props: &'a [(&'static str, Property)]) -> Vec<(&'static str, Value<'a>)> {
    props.iter().map(|(k, v)| (*k, v.value())).collect()
}

impl Property {
    fn value(&self) -> Value<'_> {
        match self {
            Self::Str(s) => Value::from(s.as_str()),
            Self::Bool(b) => Value::from(*b),
            Self::U64(n) => Value::from(*n),
        }
    }
}

/// The unit properties that carry `l` on cgroup v2 (libcontainer's v2
/// conversion): `CPUWeight` (runc's conversion of the shares),
/// `CPUQuotaPerSecUSec` (the quota per second, rounded up to systemd's 10 ms
/// granularity), `MemoryMax`, `TasksMax`.
pub fn limit_properties(l: &Limits) -> Vec<(&'static str, Property)> {
    let mut props = Vec::new();
    if let Some(s) = l.cpu_shares {
        props.push(("CPUWeight", Property::U64(limits::shares_to_weight(s))));
    }
    if let Some(q) = l.cpu_quota.and_then(|q| u64::try_from(q).ok()) {
        let per_sec = q.saturating_mul(1_000_000) / limits::CPU_PERIOD;
        props.push((
            "CPUQuotaPerSecUSec",
            Property::U64(per_sec.div_ceil(10_000).saturating_mul(10_000)),
        ));
    }
    if let Some(m) = l.memory.and_then(|m| u64::try_from(m).ok()) {
        props.push(("MemoryMax", Property::U64(m)));
    }
    if let Some(p) = l.pids.and_then(|p| u64::try_from(p).ok()) {
        props.push(("TasksMax", Property::U64(p)));
    }
    props
}

/// The properties of a new slice: libcontainer's (a description, no default
/// dependencies, accounting on) and the limits.
pub fn new_unit_properties(unit: &str, l: &Limits) -> Vec<(&'static str, Property)> {
    let mut props = vec![
        (
            "Description",
            Property::Str(format!("libcontainer container {unit}")),
        ),
        ("DefaultDependencies", Property::Bool(false)),
        ("MemoryAccounting", Property::Bool(true)),
        ("CPUAccounting", Property::Bool(true)),
        ("IOAccounting", Property::Bool(true)),
        ("TasksAccounting", Property::Bool(true)),
    ];
    props.extend(limit_properties(l));
    props
}

/// Why systemd did not make, limit or stop a unit.
#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    /// The D-Bus call failed.
    #[error("systemd unit {unit}: {source}")]
    Call {
        /// The unit.
        unit: String,
        /// What D-Bus or systemd said.
        source: zbus::Error,
    },
    /// The unit's job ended otherwise than `done`, or not in time.
    #[error("systemd unit {unit}: job {result}")]
    Job {
        /// The unit.
        unit: String,
        /// systemd's job result (`failed`, `dependency`, ...) or `timed out`.
        result: String,
    },
    /// No connection to systemd over the system bus.
    #[error("cannot reach systemd over the D-Bus system bus: {0}")]
    Connect(zbus::Error),
}

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1"
)]
trait Manager {
    fn subscribe(&self) -> zbus::Result<()>;

    fn start_transient_unit(
        &self,
        name: &str,
        mode: &str,
        properties: &[(&str, Value<'_>)],
        aux: &[(&str, &[(&str, Value<'_>)])],
    ) -> zbus::Result<OwnedObjectPath>;

    fn set_unit_properties(
        &self,
        name: &str,
        runtime: bool,
        properties: &[(&str, Value<'_>)],
    ) -> zbus::Result<()>;

    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;

    #[zbus(signal)]
    fn job_removed(
        &self,
        id: u32,
        job: OwnedObjectPath,
        unit: String,
        result: String,
    ) -> zbus::Result<()>;
}

/// A connection to systemd's manager on the system bus.
#[derive(Debug, Clone)]
pub struct Systemd {
    manager: ManagerProxy<'static>,
}

fn is_error(e: &zbus::Error, name: &str) -> bool {
    matches!(e, zbus::Error::MethodError(n, _, _) if n.as_str() == name)
}

impl Systemd {
    /// Connects to systemd over the system bus and subscribes to its jobs'
    /// signals.
    ///
    /// # Errors
    /// [`SystemdError::Connect`]: no system bus, or no systemd on it.
    pub async fn connect() -> Result<Self, SystemdError> {
        let conn = zbus::Connection::system()
            .await
            .map_err(SystemdError::Connect)?;
        let manager = ManagerProxy::new(&conn)
            .await
            .map_err(SystemdError::Connect)?;
        manager.subscribe().await.map_err(SystemdError::Connect)?;
        Ok(Self { manager })
    }

    /// Makes the slice at `path` (a [`slice_path`]) with `limits`, or sets
    /// them on it when it exists; returns once systemd made it.
    ///
    /// # Errors
    /// The call or the job that failed.
    pub async fn ensure(&self, path: &str, limits: &Limits) -> Result<(), SystemdError> {
        let unit = unit_of(path);
        let call = |source| SystemdError::Call {
            unit: unit.to_owned(),
            source,
        };
        // Subscribed before the start, so the job's end cannot be missed.
        let mut removed = self.manager.receive_job_removed().await.map_err(call)?;
        let props = new_unit_properties(unit, limits);
        let values = values(&props);
        let job = match self
            .manager
            .start_transient_unit(unit, "replace", &values, &[])
            .await
        {
            Ok(job) => job,
            Err(e) if is_error(&e, UNIT_EXISTS) => return self.set(unit, limits).await,
            Err(e) => return Err(call(e)),
        };
        let ended = tokio::time::timeout(JOB_TIMEOUT, async {
            while let Some(signal) = removed.next().await {
                if let Ok(args) = signal.args()
                    && args.job == job
                {
                    return Some(args.result);
                }
            }
            None
        })
        .await;
        match ended {
            Ok(Some(result)) if result == "done" => Ok(()),
            Ok(Some(result)) => Err(SystemdError::Job {
                unit: unit.to_owned(),
                result,
            }),
            Ok(None) => Err(SystemdError::Job {
                unit: unit.to_owned(),
                result: "lost (the signal stream ended)".to_owned(),
            }),
            Err(_) => Err(SystemdError::Job {
                unit: unit.to_owned(),
                result: "timed out".to_owned(),
            }),
        }
    }

    /// Sets `limits` on the existing `unit` (at runtime: nothing is written
    /// to `/etc`).
    async fn set(&self, unit: &str, limits: &Limits) -> Result<(), SystemdError> {
        let props = limit_properties(limits);
        if props.is_empty() {
            return Ok(());
        }
        let values = values(&props);
        self.manager
            .set_unit_properties(unit, true, &values)
            .await
            .map_err(|source| SystemdError::Call {
                unit: unit.to_owned(),
                source,
            })
    }

    /// Stops the slice at `path` (systemd removes its cgroup); a unit that is
    /// not loaded is already gone.
    ///
    /// # Errors
    /// The call that failed.
    pub async fn stop(&self, path: &str) -> Result<(), SystemdError> {
        let unit = unit_of(path);
        match self.manager.stop_unit(unit, "replace").await {
            Ok(_) => Ok(()),
            Err(e) if is_error(&e, NO_SUCH_UNIT) => Ok(()),
            Err(source) => Err(SystemdError::Call {
                unit: unit.to_owned(),
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_named_and_nested_as_upstream_names_them() {
        let parts = ["kubepods", "burstable", "pod12-34"];
        assert_eq!(slice_name(&parts), "kubepods-burstable-pod12_34.slice");
        assert_eq!(
            slice_path(&parts),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice"
        );
        assert_eq!(unit_of(&slice_path(&parts)), slice_name(&parts));
        // A cgroup root's dashes are escaped too.
        assert_eq!(
            slice_path(&["evlet-node", "kubepods"]),
            "/evlet_node.slice/evlet_node-kubepods.slice"
        );
        let none: [&str; 0] = [];
        assert_eq!(slice_path(&none), "/");
        assert_eq!(slice_name(&none), "-.slice");
    }

    #[test]
    fn limits_become_v2_unit_properties() {
        let l = Limits {
            cpu_shares: Some(1024),
            cpu_quota: Some(25_000),
            memory: Some(64 << 20),
            pids: Some(512),
        };
        assert_eq!(
            limit_properties(&l),
            [
                ("CPUWeight", Property::U64(100)),
                ("CPUQuotaPerSecUSec", Property::U64(250_000)),
                ("MemoryMax", Property::U64(64 << 20)),
                ("TasksMax", Property::U64(512)),
            ]
        );
        // 15 ms per second rounds up to systemd's 10 ms steps.
        let tiny = Limits {
            cpu_quota: Some(1500),
            ..Limits::default()
        };
        assert_eq!(
            limit_properties(&tiny),
            [("CPUQuotaPerSecUSec", Property::U64(20_000))]
        );
        let new = new_unit_properties("kubepods.slice", &Limits::default());
        assert_eq!(
            new[0],
            (
                "Description",
                Property::Str("libcontainer container kubepods.slice".into())
            )
        );
        assert!(new.contains(&("DefaultDependencies", Property::Bool(false))));
    }
}
