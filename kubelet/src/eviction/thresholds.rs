//! Eviction signals and thresholds, parsed from the KubeletConfiguration as
//! upstream parses them (`pkg/kubelet/eviction/helpers.go`
//! `ParseThresholdConfig`): a value is a quantity or a percentage of the
//! signal's capacity, `0%` and `100%` switch a signal off, a soft threshold
//! needs a grace period, and a minimum reclaim attaches to every threshold of
//! its signal.

use std::collections::BTreeMap;
use std::time::Duration;

/// What the eviction manager watches: the names of upstream's signals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    /// Node memory: capacity minus the working set.
    MemoryAvailable,
    /// Bytes available on the filesystem of the root directory.
    NodeFsAvailable,
    /// Free inodes there.
    NodeFsInodesFree,
    /// Bytes available on the runtime's image filesystem.
    ImageFsAvailable,
    /// Free inodes there.
    ImageFsInodesFree,
    /// `kernel.pid_max` minus the processes running.
    PidAvailable,
}

impl Signal {
    /// Every signal, in upstream's order of eviction priority (memory first).
    pub const ALL: [Self; 6] = [
        Self::MemoryAvailable,
        Self::NodeFsAvailable,
        Self::NodeFsInodesFree,
        Self::ImageFsAvailable,
        Self::ImageFsInodesFree,
        Self::PidAvailable,
    ];

    /// Upstream's name (`memory.available`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MemoryAvailable => "memory.available",
            Self::NodeFsAvailable => "nodefs.available",
            Self::NodeFsInodesFree => "nodefs.inodesFree",
            Self::ImageFsAvailable => "imagefs.available",
            Self::ImageFsInodesFree => "imagefs.inodesFree",
            Self::PidAvailable => "pid.available",
        }
    }

    /// The signal named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// The resource it starves (`memory`, `ephemeral-storage`, `inodes`,
    /// `pids`): the word in upstream's eviction message.
    pub fn resource(self) -> &'static str {
        match self {
            Self::MemoryAvailable => "memory",
            Self::NodeFsAvailable | Self::ImageFsAvailable => "ephemeral-storage",
            Self::NodeFsInodesFree | Self::ImageFsInodesFree => "inodes",
            Self::PidAvailable => "pids",
        }
    }

    /// The node condition it drives.
    pub fn condition(self) -> Condition {
        match self {
            Self::MemoryAvailable => Condition::Memory,
            Self::PidAvailable => Condition::Pid,
            _ => Condition::Disk,
        }
    }

    /// A filesystem signal (node-level reclaim frees images for it first).
    pub fn is_disk(self) -> bool {
        self.condition() == Condition::Disk
    }

    /// Is the value a byte count (formatted `123Ki`) rather than a count?
    pub fn is_bytes(self) -> bool {
        matches!(
            self,
            Self::MemoryAvailable | Self::NodeFsAvailable | Self::ImageFsAvailable
        )
    }
}

/// A node pressure condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Condition {
    /// `MemoryPressure`.
    Memory,
    /// `DiskPressure`.
    Disk,
    /// `PIDPressure`.
    Pid,
}

impl Condition {
    /// The node condition type.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "MemoryPressure",
            Self::Disk => "DiskPressure",
            Self::Pid => "PIDPressure",
        }
    }
}

/// A threshold's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// An absolute amount (bytes, inodes or PIDs).
    Quantity(i64),
    /// A fraction (0–1) of the signal's capacity.
    Percentage(f64),
}

impl Value {
    /// The amount it stands for on a signal with this capacity (upstream's
    /// `GetThresholdQuantity`).
    pub fn of(self, capacity: i64) -> i64 {
        match self {
            Self::Quantity(q) => q,
            Self::Percentage(p) => (capacity as f64 * p) as i64,
        }
    }
}

/// An eviction threshold: `signal < value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    /// The signal.
    pub signal: Signal,
    /// Met when the signal's available amount is below this.
    pub value: Value,
    /// How long it must be met before pods are evicted (zero: a hard threshold).
    pub grace: Duration,
    /// Once met, it stays met until this much more than `value` is available.
    pub min_reclaim: Option<Value>,
}

impl Threshold {
    /// Is this a hard threshold (`evictionHard`)?
    pub fn is_hard(&self) -> bool {
        self.grace.is_zero()
    }
}

/// The eviction manager's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Hard and soft thresholds.
    pub thresholds: Vec<Threshold>,
    /// How long a pressure condition stays after its thresholds stop being met
    /// (`evictionPressureTransitionPeriod`, upstream's default 5 min).
    pub pressure_transition: Duration,
    /// The grace period of a pod evicted for a soft threshold
    /// (`evictionMaxPodGracePeriod`).
    pub max_pod_grace: i64,
    /// How often the signals are evaluated without a kernel notification
    /// (upstream's `evictionMonitoringPeriod`, 10 s).
    pub monitoring: Duration,
    /// Let the kernel say when memory crosses a threshold (upstream's
    /// `kernelMemcgNotification`; on by default in evlet).
    pub kernel_notification: bool,
}

/// Upstream's default `evictionHard` on Linux.
pub const DEFAULT_HARD: [(&str, &str); 5] = [
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
    ("imagefs.inodesFree", "5%"),
];

/// Upstream's default `evictionPressureTransitionPeriod`.
pub const PRESSURE_TRANSITION: Duration = Duration::from_secs(300);

/// Upstream's `evictionMonitoringPeriod`.
pub const MONITORING: Duration = Duration::from_secs(10);

impl Default for Settings {
    fn default() -> Self {
        let hard = DEFAULT_HARD
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Self {
            thresholds: parse(&Config {
                hard: Some(hard),
                ..Config::default()
            })
            .map(|s| s.thresholds)
            .unwrap_or_default(),
            pressure_transition: PRESSURE_TRANSITION,
            max_pod_grace: 0,
            monitoring: MONITORING,
            kernel_notification: true,
        }
    }
}

/// The eviction fields of a KubeletConfiguration.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config {
    /// `evictionHard` (None: upstream's defaults).
    pub hard: Option<BTreeMap<String, String>>,
    /// `evictionSoft`.
    pub soft: BTreeMap<String, String>,
    /// `evictionSoftGracePeriod` (durations).
    pub soft_grace: BTreeMap<String, Duration>,
    /// `evictionMinimumReclaim`.
    pub min_reclaim: BTreeMap<String, String>,
    /// `evictionPressureTransitionPeriod`.
    pub pressure_transition: Option<Duration>,
    /// `evictionMaxPodGracePeriod`.
    pub max_pod_grace: Option<i64>,
    /// `mergeDefaultEvictionSettings`: unnamed signals keep their defaults.
    pub merge_defaults: bool,
    /// `kernelMemcgNotification`.
    pub kernel_notification: Option<bool>,
}

/// Why an eviction setting is refused; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct InvalidThreshold {
    /// The configuration field (`evictionHard[memory.available]`).
    pub field: String,
    /// What is wrong, in upstream's words.
    pub problem: String,
}

fn invalid(field: &str, signal: &str, problem: String) -> InvalidThreshold {
    InvalidThreshold {
        field: format!("{field}[{signal}]"),
        problem,
    }
}

/// Parses a threshold value; `None` for `0%`/`100%` (the signal is off).
fn value(field: &str, signal: Signal, text: &str) -> Result<Option<Value>, InvalidThreshold> {
    let name = signal.as_str();
    let text = text.trim();
    if let Some(number) = text.strip_suffix('%') {
        if text == "0%" || text == "100%" {
            return Ok(None);
        }
        let p: f64 = number
            .parse()
            .map_err(|_| invalid(field, name, format!("invalid percentage {text:?}")))?;
        if p < 0.0 {
            return Err(invalid(
                field,
                name,
                format!("eviction percentage threshold {name} must be >= 0%: {text}"),
            ));
        }
        if p > 100.0 {
            return Err(invalid(
                field,
                name,
                format!("eviction percentage threshold {name} must be <= 100%: {text}"),
            ));
        }
        return Ok(Some(Value::Percentage(p / 100.0)));
    }
    let q = crate::quantity::parse(text).map_err(|e| invalid(field, name, e.to_string()))?;
    if q == 0 {
        return Err(invalid(
            field,
            name,
            format!("eviction threshold {name} must be positive: {text}"),
        ));
    }
    Ok(Some(Value::Quantity(q)))
}

fn signal(field: &str, name: &str) -> Result<Signal, InvalidThreshold> {
    Signal::parse(name)
        .ok_or_else(|| invalid(field, name, format!("unsupported eviction signal {name}")))
}

/// The settings a configuration asks for, upstream's defaults for the rest.
///
/// # Errors
/// [`InvalidThreshold`] naming the field for an unknown signal, a value that
/// is not a positive quantity or a percentage in 0–100, or a soft threshold
/// without a grace period.
pub fn parse(config: &Config) -> Result<Settings, InvalidThreshold> {
    let mut hard: BTreeMap<String, String> = match &config.hard {
        Some(h) if !config.merge_defaults => h.clone(),
        given => {
            let mut d: BTreeMap<String, String> = DEFAULT_HARD
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            d.extend(given.iter().flatten().map(|(k, v)| (k.clone(), v.clone())));
            d
        }
    };
    // The order of upstream's signal list, not of the map.
    let mut thresholds = Vec::new();
    for s in Signal::ALL {
        if let Some(text) = hard.remove(s.as_str())
            && let Some(v) = value("evictionHard", s, &text)?
        {
            thresholds.push(Threshold {
                signal: s,
                value: v,
                grace: Duration::ZERO,
                min_reclaim: None,
            });
        }
    }
    if let Some(name) = hard.keys().next() {
        return Err(invalid(
            "evictionHard",
            name,
            format!("unsupported eviction signal {name}"),
        ));
    }
    for (name, text) in &config.soft {
        let s = signal("evictionSoft", name)?;
        let Some(v) = value("evictionSoft", s, text)? else {
            continue;
        };
        let grace = config.soft_grace.get(name).copied().ok_or_else(|| {
            invalid(
                "evictionSoftGracePeriod",
                name,
                format!("grace period must be specified for the soft eviction threshold {name}"),
            )
        })?;
        if grace.is_zero() {
            return Err(invalid(
                "evictionSoftGracePeriod",
                name,
                format!("grace period of the soft eviction threshold {name} must be positive"),
            ));
        }
        thresholds.push(Threshold {
            signal: s,
            value: v,
            grace,
            min_reclaim: None,
        });
    }
    for name in config.soft_grace.keys() {
        signal("evictionSoftGracePeriod", name)?;
    }
    for (name, text) in &config.min_reclaim {
        let s = signal("evictionMinimumReclaim", name)?;
        let v = match text.trim() {
            "0%" | "0" => None,
            _ => value("evictionMinimumReclaim", s, text)?,
        };
        for t in thresholds.iter_mut().filter(|t| t.signal == s) {
            t.min_reclaim = v;
        }
    }
    if let Some(g) = config.max_pod_grace
        && g < 0
    {
        return Err(InvalidThreshold {
            field: "evictionMaxPodGracePeriod".into(),
            problem: format!("must be >= 0, got {g}"),
        });
    }
    Ok(Settings {
        thresholds,
        pressure_transition: config.pressure_transition.unwrap_or(PRESSURE_TRANSITION),
        max_pod_grace: config.max_pod_grace.unwrap_or(0),
        monitoring: MONITORING,
        kernel_notification: config.kernel_notification.unwrap_or(true),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn defaults_are_upstreams_five_hard_thresholds() {
        let s = Settings::default();
        let names: Vec<_> = s.thresholds.iter().map(|t| t.signal.as_str()).collect();
        assert_eq!(
            names,
            [
                "memory.available",
                "nodefs.available",
                "nodefs.inodesFree",
                "imagefs.available",
                "imagefs.inodesFree"
            ]
        );
        assert_eq!(s.thresholds[0].value, Value::Quantity(100 << 20));
        assert_eq!(s.thresholds[1].value, Value::Percentage(0.1));
        assert!(s.thresholds.iter().all(Threshold::is_hard));
        assert_eq!(s.pressure_transition, Duration::from_secs(300));
    }

    #[test]
    fn a_given_hard_map_replaces_the_defaults_unless_merged() {
        let alone = parse(&Config {
            hard: Some(map(&[("memory.available", "1Gi")])),
            ..Config::default()
        })
        .expect("valid");
        assert_eq!(alone.thresholds.len(), 1);
        let merged = parse(&Config {
            hard: Some(map(&[("memory.available", "1Gi")])),
            merge_defaults: true,
            ..Config::default()
        })
        .expect("valid");
        assert_eq!(merged.thresholds.len(), 5);
        assert_eq!(merged.thresholds[0].value, Value::Quantity(1 << 30));
    }

    #[test]
    fn zero_and_hundred_percent_switch_a_signal_off() {
        let s = parse(&Config {
            hard: Some(map(&[
                ("memory.available", "0%"),
                ("nodefs.available", "100%"),
            ])),
            ..Config::default()
        })
        .expect("valid");
        assert!(s.thresholds.is_empty());
    }

    #[test]
    fn bad_thresholds_name_the_field_and_signal() {
        let err = |c: Config| parse(&c).expect_err("invalid").to_string();
        assert_eq!(
            err(Config {
                hard: Some(map(&[("memory.avail", "1Gi")])),
                ..Config::default()
            }),
            "evictionHard[memory.avail]: unsupported eviction signal memory.avail"
        );
        assert_eq!(
            err(Config {
                hard: Some(map(&[("nodefs.available", "120%")])),
                ..Config::default()
            }),
            "evictionHard[nodefs.available]: eviction percentage threshold nodefs.available must be <= 100%: 120%"
        );
        assert_eq!(
            err(Config {
                hard: Some(map(&[("memory.available", "0")])),
                ..Config::default()
            }),
            "evictionHard[memory.available]: eviction threshold memory.available must be positive: 0"
        );
        assert_eq!(
            err(Config {
                soft: map(&[("memory.available", "1Gi")]),
                ..Config::default()
            }),
            "evictionSoftGracePeriod[memory.available]: grace period must be specified for the soft eviction threshold memory.available"
        );
    }

    #[test]
    fn soft_thresholds_carry_their_grace_and_min_reclaim_applies_to_the_signal() {
        let s = parse(&Config {
            hard: Some(map(&[("memory.available", "100Mi")])),
            soft: map(&[("memory.available", "1Gi")]),
            soft_grace: [("memory.available".to_owned(), Duration::from_secs(30))].into(),
            min_reclaim: map(&[("memory.available", "500Mi")]),
            ..Config::default()
        })
        .expect("valid");
        assert_eq!(s.thresholds.len(), 2);
        assert!(s.thresholds[0].is_hard());
        assert_eq!(s.thresholds[1].grace, Duration::from_secs(30));
        assert!(
            s.thresholds
                .iter()
                .all(|t| t.min_reclaim == Some(Value::Quantity(500 << 20)))
        );
    }
}
