//! dpw's settings from the environment (`DPW_*`), all read by one rule:
//!
//! * unset, empty or blank: the setting's default;
//! * a switch: `1`, `true`, `on` or `yes` turns it on, `0`, `false`, `off` or `no` off (any
//!   case);
//! * a size: a whole number of MiB;
//! * a choice: one of its words;
//! * anything else is an error naming the variable and what it takes.
//!
//! The `dpw` command checks them all at start-up ([`check_all`]), before it reads its input or
//! opens an output, so that a mistyped value costs no run and damages no file. The places that
//! use a setting read it through the same functions.

use std::ffi::OsString;

use anyhow::{bail, Result};

/// An on/off setting.
pub struct Switch {
    pub name: &'static str,
}

/// A size in MiB.
pub struct MiB {
    pub name: &'static str,
}

/// One of a few words.
pub struct Choice {
    pub name: &'static str,
    pub words: &'static [&'static str],
}

/// Capture a CUDA training step as a graph (default on).
pub const CUDA_GRAPH: Switch = Switch {
    name: "DPW_CUDA_GRAPH",
};
/// Time every wgpu kernel (default off).
pub const WGPU_PROFILE: Switch = Switch {
    name: "DPW_WGPU_PROFILE",
};
/// The gradient all-reduce through NCCL where it can run (default on; off: host MPI).
pub const NCCL: Switch = Switch { name: "DPW_NCCL" };
/// Leave out the cpu backend's AVX-512 kernels (default off).
pub const NO_AVX512: Switch = Switch {
    name: "DPW_NO_AVX512",
};
/// MiB of training frames kept on the device (default: the backend's).
pub const RESIDENT_MB: MiB = MiB {
    name: "DPW_RESIDENT_MB",
};
/// MiB of data kept in memory (default 384).
pub const DATA_CACHE_MB: MiB = MiB {
    name: "DPW_DATA_CACHE_MB",
};
/// MiB of wgpu's largest storage binding, below the adapter's (default: the adapter's): a
/// smaller device's, as a browser's WebGPU (128), to try a run's fallbacks on.
pub const WGPU_MAX_BINDING_MB: MiB = MiB {
    name: "DPW_WGPU_MAX_BINDING_MB",
};
/// The wgpu dense kernels (default: by the kind of adapter).
pub const WGPU_DENSE: Choice = Choice {
    name: "DPW_WGPU_DENSE",
    words: &["tiled", "flat"],
};
/// How wgpu groups dispatches into compute passes (default shared).
pub const WGPU_PASSES: Choice = Choice {
    name: "DPW_WGPU_PASSES",
    words: &["shared", "each"],
};
/// Where cuda runs DPA-1's attention block (default host, until the kernels are checked on a
/// GPU).
pub const CUDA_ATTN: Choice = Choice {
    name: "DPW_CUDA_ATTN",
    words: &["host", "kernels"],
};

/// Where cuda runs the blocks recorded on the tape, DPA-2's, se_e3_tebd's and DPA-3's (default
/// host, until the kernels are checked on a GPU).
pub const CUDA_TAPE: Choice = Choice {
    name: "DPW_CUDA_TAPE",
    words: &["host", "kernels"],
};

const SWITCHES: [&Switch; 4] = [&CUDA_GRAPH, &WGPU_PROFILE, &NCCL, &NO_AVX512];
const SIZES: [&MiB; 3] = [&RESIDENT_MB, &DATA_CACHE_MB, &WGPU_MAX_BINDING_MB];
const CHOICES: [&Choice; 4] = [&WGPU_DENSE, &WGPU_PASSES, &CUDA_ATTN, &CUDA_TAPE];

/// Checks every setting's value; the first bad one is the error.
pub fn check_all() -> Result<()> {
    for s in SWITCHES {
        s.get()?;
    }
    for s in SIZES {
        s.bytes()?;
    }
    for s in CHOICES {
        s.get()?;
    }
    Ok(())
}

/// The value of `name` as text, `None` where it is unset, empty or blank (trimmed otherwise).
fn value(name: &str, v: Option<OsString>) -> Result<Option<String>> {
    let Some(v) = v else {
        return Ok(None);
    };
    let Some(text) = v.to_str() else {
        bail!("{name}={v:?} is not valid UTF-8");
    };
    let text = text.trim();
    Ok((!text.is_empty()).then(|| text.to_string()))
}

impl Switch {
    /// `Some(on)` where set, `None` where it keeps its default.
    pub fn get(&self) -> Result<Option<bool>> {
        self.parse(std::env::var_os(self.name))
    }

    fn parse(&self, v: Option<OsString>) -> Result<Option<bool>> {
        let Some(v) = value(self.name, v)? else {
            return Ok(None);
        };
        match v.to_ascii_lowercase().as_str() {
            "1" | "true" | "on" | "yes" => Ok(Some(true)),
            "0" | "false" | "off" | "no" => Ok(Some(false)),
            _ => bail!(
                "{}={v:?}: expected 1, true, on or yes (on), or 0, false, off or no (off); \
                 unset or empty keeps the default",
                self.name
            ),
        }
    }
}

impl MiB {
    /// The size in bytes where set, `None` where it keeps its default.
    pub fn bytes(&self) -> Result<Option<usize>> {
        self.parse(std::env::var_os(self.name))
    }

    fn parse(&self, v: Option<OsString>) -> Result<Option<usize>> {
        let Some(v) = value(self.name, v)? else {
            return Ok(None);
        };
        match v.parse::<usize>() {
            Ok(mb) => Ok(Some(mb.saturating_mul(1 << 20))),
            Err(_) => bail!(
                "{}={v:?}: expected a whole number of MiB, such as 512; unset or empty keeps \
                 the default",
                self.name
            ),
        }
    }
}

impl Choice {
    /// The word given, `None` where it keeps its default.
    pub fn get(&self) -> Result<Option<&'static str>> {
        self.parse(std::env::var_os(self.name))
    }

    fn parse(&self, v: Option<OsString>) -> Result<Option<&'static str>> {
        let Some(v) = value(self.name, v)? else {
            return Ok(None);
        };
        match self.words.iter().find(|w| w.eq_ignore_ascii_case(&v)) {
            Some(w) => Ok(Some(*w)),
            None => bail!(
                "{}={v:?}: expected {}; unset or empty keeps the default",
                self.name,
                self.words
                    .iter()
                    .map(|w| format!("`{w}`"))
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(s: &str) -> Option<OsString> {
        Some(OsString::from(s))
    }

    #[test]
    fn switches_take_the_same_words_everywhere() {
        for s in SWITCHES {
            for on in ["1", "true", "ON", " yes "] {
                assert_eq!(s.parse(os(on)).unwrap(), Some(true), "{}={on}", s.name);
            }
            for off in ["0", "false", "Off", "no"] {
                assert_eq!(s.parse(os(off)).unwrap(), Some(false), "{}={off}", s.name);
            }
            for default in [None, os(""), os("  ")] {
                assert_eq!(s.parse(default).unwrap(), None, "{}", s.name);
            }
            let e = format!("{:#}", s.parse(os("2")).unwrap_err());
            assert!(e.contains(s.name) && e.contains("expected 1, true"), "{e}");
        }
    }

    #[test]
    fn sizes_are_whole_mib() {
        assert_eq!(RESIDENT_MB.parse(os(" 3 ")).unwrap(), Some(3 << 20));
        assert_eq!(RESIDENT_MB.parse(os("0")).unwrap(), Some(0));
        assert_eq!(DATA_CACHE_MB.parse(os("")).unwrap(), None);
        for bad in ["abc", "-1", "1.5", "1e3"] {
            let e = format!("{:#}", DATA_CACHE_MB.parse(os(bad)).unwrap_err());
            assert!(
                e.contains("DPW_DATA_CACHE_MB") && e.contains("whole number of MiB"),
                "{e}"
            );
        }
    }

    #[test]
    fn choices_are_their_words() {
        assert_eq!(WGPU_DENSE.parse(os("Flat")).unwrap(), Some("flat"));
        assert_eq!(WGPU_DENSE.parse(os("")).unwrap(), None);
        let e = format!("{:#}", WGPU_PASSES.parse(os("all")).unwrap_err());
        assert!(
            e.contains("DPW_WGPU_PASSES=\"all\": expected `shared` or `each`"),
            "{e}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_value_not_utf8_is_named() {
        use std::os::unix::ffi::OsStringExt;
        let v = Some(OsString::from_vec(vec![0xff]));
        let e = format!("{:#}", NCCL.parse(v).unwrap_err());
        assert!(e.contains("DPW_NCCL") && e.contains("UTF-8"), "{e}");
    }
}
