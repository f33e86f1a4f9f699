//! Identifier newtypes, so a sandbox ID is never passed where a container ID belongs.

use std::fmt;

/// The first 12 characters of a runtime ID, as `crictl` prints IDs.
pub fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// Wraps an ID string as returned by the runtime.
            pub fn new(id: impl Into<String>) -> Self {
                Self(id.into())
            }

            /// The ID as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The first 12 characters, as `crictl` prints IDs.
            pub fn short(&self) -> &str {
                short(&self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<String> for $name {
            fn from(id: String) -> Self {
                Self(id)
            }
        }

        impl From<&str> for $name {
            fn from(id: &str) -> Self {
                Self(id.to_owned())
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

id_type!(
    /// A pod sandbox ID (the runtime's name for a pod's infra container and namespaces).
    SandboxId
);
id_type!(
    /// A container ID.
    ContainerId
);
