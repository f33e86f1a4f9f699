//! Node allocatable (pure): capacity minus `kubeReserved`, `systemReserved`
//! and the hard eviction thresholds, as upstream's container manager computes
//! it, and the reservations' parsing and checks.

use std::collections::BTreeMap;

use crate::eviction::thresholds::{Settings, Signal};

/// The node's resources in the units the cgroups and the API use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Resources {
    /// CPU in millicores.
    pub cpu_milli: i64,
    /// Memory in bytes.
    pub memory: i64,
    /// The root directory's filesystem in bytes.
    pub ephemeral_storage: i64,
    /// Process IDs.
    pub pids: i64,
}

impl Resources {
    /// The machine's capacity in these units.
    pub fn of(machine: &crate::machine::Machine) -> Self {
        let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        Self {
            cpu_milli: int(machine.cpus).saturating_mul(1000),
            memory: int(machine.memory),
            ephemeral_storage: int(machine.disk),
            pids: int(machine.pid_max),
        }
    }

    fn minus(self, r: &Self) -> Self {
        Self {
            cpu_milli: self.cpu_milli.saturating_sub(r.cpu_milli).max(0),
            memory: self.memory.saturating_sub(r.memory).max(0),
            ephemeral_storage: self
                .ephemeral_storage
                .saturating_sub(r.ephemeral_storage)
                .max(0),
            pids: self.pids.saturating_sub(r.pids).max(0),
        }
    }
}

/// A `kubeReserved` or `systemReserved` map: the resources it names (the
/// rest 0) and whether it named PIDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reserved {
    /// The amounts.
    pub amounts: Resources,
    /// `pid` was named (only then is `pids.max` of the pods' cgroup set).
    pub pid: bool,
}

/// Parses `field` (`kubeReserved: {cpu: 100m, memory: 256Mi}` or
/// `--kube-reserved=cpu=100m,memory=256Mi`) with upstream's rules.
///
/// # Errors
/// Upstream's message for an unknown resource or a bad or negative quantity.
pub fn parse_reserved(field: &str, map: &BTreeMap<String, String>) -> Result<Reserved, String> {
    let mut r = Reserved::default();
    for (name, value) in map {
        let bad = |e: String| format!("{field}[{name}]: {e}");
        let amount = if name == "cpu" {
            crate::quantity::parse_milli(value).map_err(|e| bad(e.to_string()))?
        } else {
            crate::quantity::parse(value).map_err(|e| bad(e.to_string()))?
        };
        if amount < 0 {
            return Err(bad(format!(
                "resource quantity for {name:?} cannot be negative: {value}"
            )));
        }
        match name.as_str() {
            "cpu" => r.amounts.cpu_milli = amount,
            "memory" => r.amounts.memory = amount,
            "ephemeral-storage" => r.amounts.ephemeral_storage = amount,
            "pid" => {
                r.amounts.pids = amount;
                r.pid = true;
            }
            _ => return Err(bad(format!("cannot reserve {name:?} resource"))),
        }
    }
    Ok(r)
}

/// What the node's allocatable comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reservations {
    /// `kubeReserved`.
    pub kube: Reserved,
    /// `systemReserved`.
    pub system: Reserved,
    /// `enforceNodeAllocatable` contains `pods`: the pods' cgroup is limited
    /// to capacity minus the reservations.
    pub enforce_pods: bool,
}

impl Reservations {
    /// Capacity minus the reservations (upstream's
    /// `getNodeAllocatableAbsolute`): what the pods' cgroup is limited to.
    pub fn absolute(&self, capacity: Resources) -> Resources {
        capacity
            .minus(&self.kube.amounts)
            .minus(&self.system.amounts)
    }

    /// The node's allocatable (upstream's status): also minus the hard
    /// `memory.available` and `nodefs.available` thresholds.
    pub fn allocatable(&self, capacity: Resources, eviction: &Settings) -> Resources {
        let mut hard = Resources::default();
        for t in eviction.thresholds.iter().filter(|t| t.is_hard()) {
            match t.signal {
                Signal::MemoryAvailable => hard.memory = t.value.of(capacity.memory),
                Signal::NodeFsAvailable => {
                    hard.ephemeral_storage = t.value.of(capacity.ephemeral_storage);
                }
                _ => {}
            }
        }
        self.absolute(capacity).minus(&hard)
    }

    /// The pods' cgroup's limits: with `pods` enforced, the absolute
    /// allocatable (memory, CPU shares, PIDs when reserved); otherwise the
    /// capacity's CPU shares alone, as upstream creates it unenforced.
    pub fn pods_cgroup(&self, capacity: Resources) -> super::limits::Limits {
        if !self.enforce_pods {
            return super::limits::Limits {
                cpu_shares: Some(super::limits::milli_to_shares(capacity.cpu_milli)),
                ..Default::default()
            };
        }
        let a = self.absolute(capacity);
        super::limits::Limits {
            cpu_shares: Some(super::limits::milli_to_shares(a.cpu_milli)),
            cpu_quota: None,
            memory: Some(a.memory),
            pids: (self.kube.pid || self.system.pid).then_some(a.pids),
        }
    }
}

/// Checks `enforceNodeAllocatable` as upstream does, refusing what evlet does
/// not enforce; returns whether `pods` is enforced.
///
/// # Errors
/// Upstream's messages, or why evlet refuses the option.
pub fn parse_enforce(options: &[String]) -> Result<bool, String> {
    const VALID: [&str; 4] = ["pods", "system-reserved", "kube-reserved", "none"];
    for o in options {
        if !VALID.contains(&o.as_str()) {
            return Err(format!(
                "invalid configuration: option {o:?} specified for enforceNodeAllocatable (--enforce-node-allocatable). Valid options are \"pods\", \"system-reserved\", \"kube-reserved\", or \"none\""
            ));
        }
    }
    if options.iter().any(|o| o == "none") && options.len() > 1 {
        return Err("invalid configuration: enforceNodeAllocatable (--enforce-node-allocatable) may not contain additional enforcements when \"none\" is specified".into());
    }
    if let Some(o) = options
        .iter()
        .find(|o| *o == "system-reserved" || *o == "kube-reserved")
    {
        return Err(format!(
            "enforceNodeAllocatable (--enforce-node-allocatable): {o:?} is refused: evlet does not manage the {o} cgroup (only \"pods\" is enforced)"
        ));
    }
    Ok(options.iter().any(|o| o == "pods"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    const CAPACITY: Resources = Resources {
        cpu_milli: 2000,
        memory: 8 << 30,
        ephemeral_storage: 100 << 30,
        pids: 4_194_304,
    };

    #[test]
    fn reservations_parse_with_upstreams_rules() {
        let r = parse_reserved(
            "kubeReserved",
            &map(&[("cpu", "250m"), ("memory", "1Gi"), ("pid", "1000")]),
        )
        .expect("valid");
        assert_eq!(r.amounts.cpu_milli, 250);
        assert_eq!(r.amounts.memory, 1 << 30);
        assert!(r.pid);
        assert_eq!(
            parse_reserved("systemReserved", &map(&[("gpu", "1")])).expect_err("unknown"),
            "systemReserved[gpu]: cannot reserve \"gpu\" resource"
        );
        let negative =
            parse_reserved("kubeReserved", &map(&[("memory", "-1Gi")])).expect_err("negative");
        assert!(negative.starts_with("kubeReserved[memory]: "), "{negative}");
        assert!(parse_reserved("kubeReserved", &map(&[("cpu", "lots")])).is_err());
    }

    #[test]
    fn allocatable_is_capacity_minus_reservations_and_hard_eviction() {
        let r = Reservations {
            kube: parse_reserved("kubeReserved", &map(&[("cpu", "100m"), ("memory", "1Gi")]))
                .expect("valid"),
            system: parse_reserved(
                "systemReserved",
                &map(&[("memory", "512Mi"), ("ephemeral-storage", "1Gi")]),
            )
            .expect("valid"),
            enforce_pods: true,
        };
        let eviction = crate::eviction::thresholds::parse(&Default::default()).expect("defaults");
        let a = r.allocatable(CAPACITY, &eviction);
        assert_eq!(a.cpu_milli, 1900);
        assert_eq!(a.memory, (8 << 30) - (1 << 30) - (512 << 20) - (100 << 20));
        // nodefs.available < 10 % of 100 GiB.
        assert_eq!(a.ephemeral_storage, (99 << 30) - (10 << 30));
        // The pods' cgroup: no eviction threshold in it.
        let l = r.pods_cgroup(CAPACITY);
        assert_eq!(l.memory, Some((8 << 30) - (1 << 30) - (512 << 20)));
        assert_eq!(l.cpu_shares, Some(1945));
        assert_eq!(l.pids, None, "no pid reserved");
        let unenforced = Reservations {
            enforce_pods: false,
            ..r
        };
        assert_eq!(unenforced.pods_cgroup(CAPACITY).memory, None);
        assert_eq!(unenforced.pods_cgroup(CAPACITY).cpu_shares, Some(2048));
    }

    #[test]
    fn enforcement_options_as_upstream_checks_them() {
        let v = |s: &[&str]| s.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(parse_enforce(&v(&["pods"])), Ok(true));
        assert_eq!(parse_enforce(&v(&["none"])), Ok(false));
        assert_eq!(parse_enforce(&v(&[])), Ok(false));
        assert!(
            parse_enforce(&v(&["none", "pods"]))
                .expect_err("mixed")
                .contains("may not contain additional")
        );
        assert!(
            parse_enforce(&v(&["all"]))
                .expect_err("unknown")
                .contains("Valid options are")
        );
        assert!(
            parse_enforce(&v(&["pods", "kube-reserved"]))
                .expect_err("refused")
                .contains("is refused")
        );
    }
}
