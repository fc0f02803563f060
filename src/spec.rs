//! Device specs: `cpu`, `cuda:1`, and their aliases.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// A backend name a spec may use: its canonical id, its aliases, and whether
/// this build contains it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecName {
    /// The canonical id, as printed (`"cuda"`).
    pub id: &'static str,
    /// Other accepted spellings, lower case (`"gpu"`).
    pub aliases: &'static [&'static str],
    /// `None` when compiled in, else the cargo feature that enables it.
    pub missing_feature: Option<&'static str>,
}

/// The backend names this crate knows. Matching ignores ASCII case.
///
/// | canonical | aliases          | compiled in            |
/// |-----------|------------------|------------------------|
/// | `cpu`     | `host`           | always                 |
/// | `cuda`    | `gpu`, `nvidia`  | with feature `cuda`    |
pub const SPEC_NAMES: &[SpecName] = &[
    SpecName {
        id: "cpu",
        aliases: &["host"],
        missing_feature: None,
    },
    SpecName {
        id: "cuda",
        aliases: &["gpu", "nvidia"],
        // Without the feature, every CUDA spec is an error that says how to
        // compile it in.
        missing_feature: if cfg!(feature = "cuda") {
            None
        } else {
            Some("cuda")
        },
    },
    SpecName {
        id: "vulkan",
        aliases: &["vk"],
        missing_feature: if cfg!(all(feature = "vulkan", not(loom))) {
            None
        } else {
            Some("vulkan")
        },
    },
];

/// Names a device: a backend and an ordinal. Prints canonically as
/// `backend:ordinal` (`cuda:1`, `cpu:0`).
///
/// Parsing accepts the canonical id or an alias, in any ASCII case, with an
/// optional `:ORDINAL` (default 0), with optional whitespace around either
/// part: `cpu`, `CPU`, `host`, `cuda`, `cuda:1`, `gpu:2`, `nvidia:0`,
/// `cuda : 1`. Whitespace inside a part (`cpu 0`, `cuda:1 2`) is an error
/// that shows how to write the spec. A backend not compiled into this build
/// is an error that names the feature to enable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceSpec {
    backend: &'static str,
    ordinal: u32,
}

impl DeviceSpec {
    /// A spec for backend id `backend` (canonical, e.g. `"cuda"`), device `ordinal`.
    pub const fn new(backend: &'static str, ordinal: u32) -> Self {
        Self { backend, ordinal }
    }

    /// The CPU.
    pub const fn cpu() -> Self {
        Self::new("cpu", 0)
    }

    /// CUDA device `ordinal` (whether or not CUDA is compiled in).
    pub const fn cuda(ordinal: u32) -> Self {
        Self::new("cuda", ordinal)
    }

    /// The canonical backend id.
    pub const fn backend(&self) -> &'static str {
        self.backend
    }

    /// The device ordinal within the backend.
    pub const fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Parses `input` against a list of backend names (a registry of your own
    /// backends passes its list; [`FromStr`] uses [`SPEC_NAMES`]).
    ///
    /// # Errors
    /// [`Error::InvalidDeviceSpec`] naming what is accepted;
    /// [`Error::BackendNotCompiled`] for a known backend missing from this build.
    pub fn parse_with(input: &str, names: &[SpecName]) -> Result<Self> {
        let invalid = |reason: String| Error::InvalidDeviceSpec {
            input: input.to_owned(),
            reason,
            accepted: accepted(names),
        };
        // Whitespace around a part is padding (`cuda : 1`); inside one it
        // is a mistake the reason explains.
        let (name, ordinal) = match input.split_once(':') {
            Some((name, ordinal)) => (name.trim(), Some(ordinal.trim())),
            None => (input.trim(), None),
        };
        let spaced = |part: &str| {
            if part.contains(char::is_whitespace) {
                "; write a backend name, then optionally `:` and a device number, with no \
                 spaces inside either (`cpu:0`, `cuda:1`)"
            } else {
                ""
            }
        };
        if name.is_empty() {
            return Err(invalid("the backend name is missing".into()));
        }
        let known = names
            .iter()
            .find(|known| {
                known.id.eq_ignore_ascii_case(name)
                    || known.aliases.iter().any(|a| a.eq_ignore_ascii_case(name))
            })
            .ok_or_else(|| invalid(format!("unknown backend `{name}`{}", spaced(name))))?;
        let ordinal = match ordinal {
            None => 0,
            Some(text) => parse_ordinal(text).ok_or_else(|| {
                invalid(format!(
                    "the ordinal `{text}` is not a device number (0 to {}){}",
                    u32::MAX,
                    spaced(text)
                ))
            })?,
        };
        if let Some(feature) = known.missing_feature {
            return Err(Error::BackendNotCompiled {
                backend: known.id,
                feature,
            });
        }
        Ok(Self::new(known.id, ordinal))
    }
}

/// Decimal digits only: no sign, no spaces, no empty string.
fn parse_ordinal(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

fn accepted(names: &[SpecName]) -> String {
    names
        .iter()
        .map(|n| {
            let mut s = format!("`{}`", n.id);
            for alias in n.aliases {
                s.push_str(&format!("/`{alias}`"));
            }
            s
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl FromStr for DeviceSpec {
    type Err = Error;

    fn from_str(input: &str) -> Result<Self> {
        Self::parse_with(input, SPEC_NAMES)
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.backend, self.ordinal)
    }
}
