//! What the eviction manager did, for `/debug/eviction` (`evlet diag`-style
//! reading and the benchmark): how many passes ran and why, the last one, and
//! the recent passes that found a threshold to act on.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Serialize;

use crate::lock::lock;

/// How many acting passes are kept.
pub const KEPT: usize = 64;

/// One pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pass {
    /// When it evaluated (Unix ns).
    pub at_ns: i64,
    /// Why it ran: `timer`, `memcg`, `psi`, `after-eviction`.
    pub trigger: &'static str,
    /// The node's pressure conditions after it.
    pub conditions: Vec<&'static str>,
    /// The signal of the threshold it acted on, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<&'static str>,
    /// That threshold's amount.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold: Option<i64>,
    /// What was available.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available: Option<i64>,
    /// The pod it evicted (`namespace/name`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evicted: Option<String>,
}

/// The kernel notifications armed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Kernel {
    /// Memory cgroup usage thresholds armed at the last pass.
    pub memcg_thresholds: usize,
    /// Whether the PSI memory trigger is armed.
    pub psi: bool,
}

/// `/debug/eviction`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct View {
    /// Passes so far, by trigger.
    pub passes: std::collections::BTreeMap<&'static str, u64>,
    /// The kernel notifications.
    pub kernel: Kernel,
    /// The last pass.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last: Option<Pass>,
    /// Recent passes that acted (oldest first).
    pub acting: Vec<Pass>,
}

/// The journal, shared by the manager (writer) and the server (reader).
#[derive(Debug, Default)]
pub struct Journal {
    inner: Mutex<(View, VecDeque<Pass>)>,
}

impl Journal {
    /// Notes a pass.
    pub fn pass(&self, pass: Pass) {
        let mut g = lock(&self.inner);
        let (view, acting) = &mut *g;
        *view.passes.entry(pass.trigger).or_default() += 1;
        if pass.signal.is_some() {
            if acting.len() == KEPT {
                acting.pop_front();
            }
            acting.push_back(pass.clone());
        }
        view.last = Some(pass);
    }

    /// Notes the pod the last pass evicted, for `signal` (a threshold's, or a
    /// local storage limit's such as `emptydirfs.limit`).
    pub fn evicted(&self, pod: String, signal: &'static str) {
        let mut g = lock(&self.inner);
        let (view, acting) = &mut *g;
        let Some(last) = view.last.as_mut() else {
            return;
        };
        last.evicted = Some(pod);
        if last.signal.is_none() {
            // A pass without a threshold met that evicted for a local limit.
            last.signal = Some(signal);
            if acting.len() == KEPT {
                acting.pop_front();
            }
            acting.push_back(last.clone());
        } else if let Some(p) = acting.back_mut() {
            *p = last.clone();
        }
    }

    /// Notes the kernel notifications armed.
    pub fn kernel(&self, kernel: Kernel) {
        lock(&self.inner).0.kernel = kernel;
    }

    /// What `/debug/eviction` shows.
    pub fn view(&self) -> View {
        let g = lock(&self.inner);
        View {
            acting: g.1.iter().cloned().collect(),
            ..g.0.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(at: i64, signal: Option<&'static str>) -> Pass {
        Pass {
            at_ns: at,
            trigger: "timer",
            conditions: Vec::new(),
            signal,
            threshold: None,
            available: None,
            evicted: None,
        }
    }

    #[test]
    fn it_counts_passes_and_keeps_the_recent_acting_ones() {
        let j = Journal::default();
        for i in 0..100 {
            j.pass(pass(i, (i % 2 == 0).then_some("memory.available")));
        }
        j.pass(pass(100, Some("memory.available")));
        j.evicted("default/hog".into(), "memory.available");
        let v = j.view();
        assert_eq!(v.passes["timer"], 101);
        assert_eq!(v.acting.len(), 51.min(KEPT));
        let last = v.acting.last().expect("acting");
        assert_eq!(
            (last.at_ns, last.evicted.as_deref()),
            (100, Some("default/hog"))
        );
        // A pass with no threshold met that evicted for a local limit becomes
        // an acting pass of its own.
        j.pass(pass(101, None));
        j.evicted("default/big".into(), "emptydirfs.limit");
        let v = j.view();
        let last = v.acting.last().expect("acting");
        assert_eq!((last.at_ns, last.signal), (101, Some("emptydirfs.limit")));
        assert_eq!(v.last.and_then(|p| p.evicted), Some("default/big".into()));
    }
}
