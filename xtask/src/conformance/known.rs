//! What is known about specs that do not pass here: why, and what it needs.
//!
//! Each entry is a fragment of a spec's full text. An entry with a skip
//! reason is left out of the run (it cannot pass on this machine, with
//! either kubelet); the others explain a failure in the report. Entries are
//! written after reading the spec's source and the kubelets' logs; a failure
//! no entry explains is reported with its own first message line.

/// Why a spec does not pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// This machine cannot give the spec what it needs (registry, DNS, kube-proxy).
    Environment,
    /// evlet lacks a capability another open issue builds.
    NeedsIssue(&'static str),
}

/// One known spec.
#[derive(Debug, Clone, Copy)]
pub struct Known {
    /// A fragment of the spec's full text.
    pub fragment: &'static str,
    /// Left out of the run, for this reason.
    pub skip: bool,
    /// The class.
    pub class: Class,
    /// The explanation.
    pub why: &'static str,
}

impl Known {
    /// The report's note.
    pub fn note(&self) -> String {
        match self.class {
            Class::Environment if self.skip => format!("skipped: {}", self.why),
            Class::Environment => format!("environment: {}", self.why),
            Class::NeedsIssue(issue) => format!("needs {issue}: {}", self.why),
        }
    }
}

/// The table.
pub const KNOWN: &[Known] = &[
    Known {
        fragment: "when running a container with a new image should be able to pull image",
        skip: true,
        class: Class::Environment,
        why: "pulls agnhost with imagePullPolicy Always from registry.k8s.io; no registry is reachable here",
    },
    Known {
        fragment: "PrivilegedPod [NodeConformance] should enable privileged commands",
        skip: true,
        class: Class::Environment,
        why: "runs `ip link add dummy1 type dummy`; this machine's kernel has no dummy link type (\"Unknown device type\" on the host too)",
    },
    Known {
        fragment: "ConfigMap should be consumable via the environment",
        skip: false,
        class: Class::Environment,
        why: "the spec prints `sh -c env` in busybox; this machine's busybox (Debian's 1.35) drops names that are not identifiers (`data-1`) from what its sh passes on, upstream's 1.36 image keeps them (images.rs)",
    },
    Known {
        fragment: "ConfigMap should be consumable as environment variable names with various prefixes",
        skip: false,
        class: Class::Environment,
        why: "the spec prints `sh -c env` in busybox; this machine's busybox (Debian's 1.35) drops names that are not identifiers (`data-1`) from what its sh passes on, upstream's 1.36 image keeps them (images.rs)",
    },
    Known {
        fragment: "Secrets should be consumable via the environment",
        skip: false,
        class: Class::Environment,
        why: "the spec prints `sh -c env` in busybox; this machine's busybox (Debian's 1.35) drops names that are not identifiers (`data-1`) from what its sh passes on, upstream's 1.36 image keeps them (images.rs)",
    },
    Known {
        fragment: "Secrets should be consumable as environment variable names variable names with various prefixes",
        skip: false,
        class: Class::Environment,
        why: "the spec prints `sh -c env` in busybox; this machine's busybox (Debian's 1.35) drops names that are not identifiers (`data-1`) from what its sh passes on, upstream's 1.36 image keeps them (images.rs)",
    },
    Known {
        fragment: "Ephemeral Containers [NodeConformance]",
        skip: false,
        class: Class::NeedsIssue("#47 (ephemeral containers)"),
        why: "evlet refuses ephemeral containers by name until #47 builds them",
    },
];

/// The entry whose fragment the spec's text contains.
pub fn explain(name: &str) -> Option<&'static Known> {
    KNOWN.iter().find(|k| name.contains(k.fragment))
}

/// The skips: (fragment, why).
pub fn skips() -> Vec<(&'static str, &'static str)> {
    KNOWN
        .iter()
        .filter(|k| k.skip)
        .map(|k| (k.fragment, k.why))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fragment_is_unique_and_a_skip_is_environmental() {
        for (i, a) in KNOWN.iter().enumerate() {
            for b in &KNOWN[i + 1..] {
                assert!(
                    !a.fragment.contains(b.fragment) && !b.fragment.contains(a.fragment),
                    "{} overlaps {}",
                    a.fragment,
                    b.fragment
                );
            }
            assert!(!a.skip || a.class == Class::Environment, "{}", a.fragment);
        }
        assert!(explain("[sig-node] Container Runtime blackbox test when running a container with a new image should be able to pull image [NodeConformance]").is_some());
    }
}
