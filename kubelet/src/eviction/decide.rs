//! The pure part of one evaluation (upstream's `synchronize` before it acts):
//! which thresholds are met, with minimum reclaim for those met before; how
//! long each has been met (soft thresholds wait their grace); which pressure
//! conditions the node has, kept for `evictionPressureTransitionPeriod`
//! after their thresholds stop being met; and which threshold to act on.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::thresholds::{Condition, Settings, Signal, Threshold};
use crate::stats::NodeStats;

/// One signal as observed: what is available of what capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// Available now.
    pub available: i64,
    /// The whole.
    pub capacity: i64,
}

/// Every signal observed in one pass.
pub type Observations = BTreeMap<Signal, Observation>;

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The signals of the node's stats, as upstream's `makeSignalObservations`
/// reads them. A signal whose numbers are missing is not observed.
pub fn observe(node: &NodeStats) -> Observations {
    let mut o = Observations::new();
    if let Some(m) = &node.memory
        && let (Some(available), Some(ws)) = (m.available_bytes, m.working_set_bytes)
    {
        o.insert(
            Signal::MemoryAvailable,
            Observation {
                available: int(available),
                capacity: int(available.saturating_add(ws)),
            },
        );
    }
    let fs = |o: &mut Observations, fs: Option<&crate::stats::FsStats>, bytes, inodes| {
        let Some(fs) = fs else { return };
        if let (Some(a), Some(c)) = (fs.available_bytes, fs.capacity_bytes) {
            o.insert(
                bytes,
                Observation {
                    available: int(a),
                    capacity: int(c),
                },
            );
        }
        if let (Some(a), Some(c)) = (fs.inodes_free, fs.inodes) {
            o.insert(
                inodes,
                Observation {
                    available: int(a),
                    capacity: int(c),
                },
            );
        }
    };
    fs(
        &mut o,
        node.fs.as_ref(),
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
    );
    // The image filesystem's capacity comes from its mount; without one (no
    // separate image filesystem known), it is the node's filesystem.
    let image = node
        .runtime
        .as_ref()
        .and_then(|r| r.image_fs.as_ref())
        .filter(|f| f.capacity_bytes.is_some())
        .or(node.fs.as_ref());
    fs(
        &mut o,
        image,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
    );
    if let Some(r) = &node.rlimit
        && r.maxpid > 0
    {
        o.insert(
            Signal::PidAvailable,
            Observation {
                available: int(r.maxpid.saturating_sub(r.curproc)),
                capacity: int(r.maxpid),
            },
        );
    }
    o
}

/// Which pressure conditions the node has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pressure {
    /// `MemoryPressure`.
    pub memory: bool,
    /// `DiskPressure`.
    pub disk: bool,
    /// `PIDPressure`.
    pub pid: bool,
}

impl Pressure {
    fn set(&mut self, c: Condition) {
        match c {
            Condition::Memory => self.memory = true,
            Condition::Disk => self.disk = true,
            Condition::Pid => self.pid = true,
        }
    }

    /// The conditions, in upstream's order.
    pub fn conditions(self) -> Vec<Condition> {
        [
            (self.memory, Condition::Memory),
            (self.disk, Condition::Disk),
            (self.pid, Condition::Pid),
        ]
        .into_iter()
        .filter_map(|(on, c)| on.then_some(c))
        .collect()
    }

    /// Is any condition on?
    pub fn any(self) -> bool {
        self.memory || self.disk || self.pid
    }
}

/// What one evaluation found.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// The node's pressure conditions.
    pub pressure: Pressure,
    /// The threshold to reclaim for now (grace passed), memory first; with the
    /// amount it stands for and what is available.
    pub act_on: Option<(Threshold, i64, i64)>,
}

/// What the evaluations remember between passes.
#[derive(Debug, Default)]
pub struct State {
    /// Indices (into the settings) of thresholds met at the last pass.
    met: Vec<usize>,
    /// When each threshold was first seen met (reset when it stops).
    first_met: BTreeMap<usize, Instant>,
    /// When each condition was last seen.
    condition_seen: BTreeMap<Condition, Instant>,
}

/// Is `t` met by `o`? With `min_reclaim`, the threshold's quantity grows by
/// its minimum reclaim (a threshold met before stays met until that much more
/// is available).
fn met(t: &Threshold, o: &Observation, min_reclaim: bool) -> bool {
    let mut quantity = t.value.of(o.capacity);
    if min_reclaim && let Some(extra) = t.min_reclaim {
        quantity = quantity.saturating_add(extra.of(o.capacity));
    }
    quantity > o.available
}

impl State {
    /// Evaluates the observations at `now`.
    pub fn evaluate(&mut self, s: &Settings, obs: &Observations, now: Instant) -> Evaluation {
        let mut met_now = Vec::new();
        for (i, t) in s.thresholds.iter().enumerate() {
            let Some(o) = obs.get(&t.signal) else {
                continue;
            };
            if met(t, o, false) || (self.met.contains(&i) && met(t, o, true)) {
                met_now.push(i);
            }
        }
        self.first_met.retain(|i, _| met_now.contains(i));
        for &i in &met_now {
            self.first_met.entry(i).or_insert(now);
        }
        // Conditions come from every met threshold, soft ones in their grace too.
        for &i in &met_now {
            self.condition_seen
                .insert(s.thresholds[i].signal.condition(), now);
        }
        let mut pressure = Pressure::default();
        self.condition_seen.retain(|c, seen| {
            let on = now.saturating_duration_since(*seen) < s.pressure_transition || *seen == now;
            if on {
                pressure.set(*c);
            }
            on
        });
        let ready: Vec<usize> = met_now
            .iter()
            .copied()
            .filter(|i| {
                let t = &s.thresholds[*i];
                self.first_met
                    .get(i)
                    .is_some_and(|at| now.saturating_duration_since(*at) >= t.grace)
            })
            .collect();
        self.met = met_now;
        // Memory first, then the configured order (upstream's byEvictionPriority).
        let act_on = ready
            .iter()
            .copied()
            .min_by_key(|i| (s.thresholds[*i].signal != Signal::MemoryAvailable, *i))
            .and_then(|i| {
                let t = s.thresholds[i].clone();
                let o = obs.get(&t.signal)?;
                Some((t.clone(), t.value.of(o.capacity), o.available))
            });
        Evaluation { pressure, act_on }
    }

    /// The thresholds met at the last pass that `obs` still meets, minimum
    /// reclaim included (upstream's check after node-level reclaim).
    pub fn met_now(&self, s: &Settings, obs: &Observations) -> Vec<usize> {
        self.met
            .iter()
            .copied()
            .filter(|&i| {
                s.thresholds
                    .get(i)
                    .zip(s.thresholds.get(i).and_then(|t| obs.get(&t.signal)))
                    .is_some_and(|(t, o)| met(t, o, true))
            })
            .collect()
    }

    /// Whether a `memory.available` threshold was met at the last pass.
    pub fn memory_met(&self, s: &Settings) -> bool {
        self.met.iter().any(|i| {
            s.thresholds
                .get(*i)
                .is_some_and(|t| t.signal == Signal::MemoryAvailable)
        })
    }

    /// How long until a soft threshold in its grace is due (None: none waits).
    pub fn next_due(&self, s: &Settings, now: Instant) -> Option<Duration> {
        self.first_met
            .iter()
            .filter_map(|(i, at)| {
                let grace = s.thresholds.get(*i)?.grace;
                let due = *at + grace;
                (!grace.is_zero() && due > now).then(|| due - now)
            })
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::super::thresholds::{Config, Value, parse};
    use super::*;

    fn settings(soft: bool) -> Settings {
        let mut c = Config {
            hard: Some(
                [
                    ("memory.available".to_owned(), "100Mi".to_owned()),
                    ("nodefs.available".to_owned(), "10%".to_owned()),
                ]
                .into(),
            ),
            min_reclaim: [("memory.available".to_owned(), "50Mi".to_owned())].into(),
            pressure_transition: Some(Duration::from_secs(30)),
            ..Config::default()
        };
        if soft {
            c.soft = [("memory.available".to_owned(), "1Gi".to_owned())].into();
            c.soft_grace = [("memory.available".to_owned(), Duration::from_secs(20))].into();
        }
        parse(&c).expect("valid")
    }

    fn obs(memory_mi: i64, disk_percent: i64) -> Observations {
        [
            (
                Signal::MemoryAvailable,
                Observation {
                    available: memory_mi << 20,
                    capacity: 8 << 30,
                },
            ),
            (
                Signal::NodeFsAvailable,
                Observation {
                    available: disk_percent,
                    capacity: 100,
                },
            ),
        ]
        .into()
    }

    #[test]
    fn a_hard_threshold_acts_at_once_and_min_reclaim_keeps_it_met() {
        let s = settings(false);
        let mut st = State::default();
        let t0 = Instant::now();
        let e = st.evaluate(&s, &obs(2000, 50), t0);
        assert_eq!(e.pressure, Pressure::default());
        assert!(e.act_on.is_none());
        let e = st.evaluate(&s, &obs(90, 50), t0 + Duration::from_secs(1));
        assert!(e.pressure.memory && !e.pressure.disk);
        let (t, quantity, available) = e.act_on.expect("act");
        assert_eq!(t.signal, Signal::MemoryAvailable);
        assert_eq!((quantity, available), (100 << 20, 90 << 20));
        // Above 100Mi but below 100Mi + 50Mi minimum reclaim: still met.
        let e = st.evaluate(&s, &obs(120, 50), t0 + Duration::from_secs(2));
        assert!(e.act_on.is_some());
        assert!(st.memory_met(&s));
        let e = st.evaluate(&s, &obs(160, 50), t0 + Duration::from_secs(3));
        assert!(e.act_on.is_none());
        assert!(!st.memory_met(&s));
        // Disk alone is not memory.
        st.evaluate(&s, &obs(160, 5), t0 + Duration::from_secs(4));
        assert!(!st.memory_met(&s));
        // The condition stays for the transition period, then goes.
        assert!(e.pressure.memory);
        let e = st.evaluate(&s, &obs(160, 50), t0 + Duration::from_secs(40));
        assert!(!e.pressure.memory);
    }

    #[test]
    fn memory_is_reclaimed_before_disk() {
        let s = settings(false);
        let mut st = State::default();
        let e = st.evaluate(&s, &obs(50, 5), Instant::now());
        assert!(e.pressure.memory && e.pressure.disk);
        assert_eq!(e.act_on.expect("act").0.signal, Signal::MemoryAvailable);
        let mut st = State::default();
        let e = st.evaluate(&s, &obs(5000, 5), Instant::now());
        let (t, quantity, _) = e.act_on.expect("act");
        assert_eq!(t.signal, Signal::NodeFsAvailable);
        assert_eq!(t.value, Value::Percentage(0.1));
        assert_eq!(quantity, 10);
    }

    #[test]
    fn a_soft_threshold_sets_the_condition_at_once_and_acts_after_its_grace() {
        let s = settings(true);
        let mut st = State::default();
        let t0 = Instant::now();
        let e = st.evaluate(&s, &obs(500, 50), t0);
        assert!(e.pressure.memory, "in grace: the condition is already on");
        assert!(e.act_on.is_none());
        assert_eq!(st.next_due(&s, t0), Some(Duration::from_secs(20)));
        // A hard threshold met never shortens the wait.
        st.evaluate(&s, &obs(50, 50), t0);
        assert_eq!(st.next_due(&s, t0), Some(Duration::from_secs(20)));
        let e = st.evaluate(&s, &obs(500, 50), t0 + Duration::from_secs(20));
        assert!(!e.act_on.expect("act").0.is_hard());
        // Recovering resets the grace.
        st.evaluate(&s, &obs(5000, 50), t0 + Duration::from_secs(21));
        let e = st.evaluate(&s, &obs(500, 50), t0 + Duration::from_secs(22));
        assert!(e.act_on.is_none());
    }
}
