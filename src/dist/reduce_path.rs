//! Which way the gradient all-reduce goes: NCCL on the GPUs' buffers, or host MPI (a read-back,
//! `MPI_Allreduce` on the host, a write-back). Every rank brings its [`RankFacts`]; all ranks
//! see the same list (an all-gather) and [`choose`] is a pure function of it, so they agree.

use serde::{Deserialize, Serialize};

/// What one rank brings to the choice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankFacts {
    pub host: String,
    /// The backend's name, for the log.
    pub backend: String,
    /// The CUDA device's UUID when the rank computes on CUDA; None on other backends.
    pub gpu: Option<String>,
    /// NCCL's version when its library loads, else why it does not.
    pub nccl: Result<String, String>,
}

/// The all-reduce every rank uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReducePath {
    /// NCCL, this version, on the device buffers.
    Nccl(String),
    /// Host MPI; `why` is set when NCCL was possible in principle (every rank on CUDA) but is
    /// not used, for a warning.
    Host { why: Option<String> },
}

/// The rank numbers as a short list: "1", "1, 3".
fn ranks(r: &[usize]) -> String {
    r.iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The path for ranks with these facts (in rank order); `disabled` when the user asked for host
/// MPI (`DPW_NCCL=0`). NCCL needs every rank on CUDA, the library on every rank, in one version,
/// and a GPU of its own for every rank: NCCL refuses two ranks of one communicator on one device.
pub fn choose(facts: &[RankFacts], disabled: bool) -> ReducePath {
    let not_cuda: Vec<usize> = (0..facts.len())
        .filter(|&r| facts[r].gpu.is_none())
        .collect();
    if not_cuda.len() == facts.len() {
        return ReducePath::Host { why: None };
    }
    let mut why = Vec::new();
    if !not_cuda.is_empty() {
        why.push(format!(
            "rank(s) {} do not compute on CUDA ({})",
            ranks(&not_cuda),
            facts[not_cuda[0]].backend
        ));
    }
    if disabled {
        why.push("DPW_NCCL=0 asks for host MPI".to_string());
    }
    let no_lib: Vec<usize> = (0..facts.len())
        .filter(|&r| facts[r].gpu.is_some() && facts[r].nccl.is_err())
        .collect();
    if let Some(&first) = no_lib.first() {
        let e = facts[first].nccl.as_ref().err().map_or("", String::as_str);
        why.push(format!(
            "NCCL cannot be loaded on rank(s) {}: {e}",
            ranks(&no_lib)
        ));
    }
    let mut versions: Vec<&str> = facts
        .iter()
        .filter_map(|f| f.nccl.as_deref().ok())
        .collect();
    versions.sort_unstable();
    versions.dedup();
    if versions.len() > 1 {
        why.push(format!(
            "the ranks load different NCCL versions ({})",
            versions.join(", ")
        ));
    }
    for (a, fa) in facts.iter().enumerate() {
        let Some(gpu) = &fa.gpu else { continue };
        let shared: Vec<usize> = (a..facts.len())
            .filter(|&r| facts[r].gpu.as_ref() == Some(gpu) && facts[r].host == fa.host)
            .collect();
        // Each group once, from its first rank.
        let first = (0..a).all(|r| facts[r].gpu.as_ref() != Some(gpu) || facts[r].host != fa.host);
        if shared.len() > 1 && first {
            why.push(format!(
                "ranks {} share GPU {gpu} on {} (NCCL needs a GPU per rank)",
                ranks(&shared),
                fa.host
            ));
        }
    }
    if why.is_empty() {
        ReducePath::Nccl(versions.first().map_or("", |v| v).to_string())
    } else {
        ReducePath::Host {
            why: Some(why.join("; ")),
        }
    }
}

/// NCCL's version code (`ncclGetVersion`: 22803 for 2.28.3) in words.
pub fn nccl_version(code: i32) -> String {
    // From NCCL 2.9 on the code is major·10000 + minor·100 + patch; before, ·1000 and ·100.
    let (major, minor, patch) = if code >= 10000 {
        (code / 10000, code / 100 % 100, code % 100)
    } else {
        (code / 1000, code / 100 % 10, code % 100)
    };
    format!("{major}.{minor}.{patch}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(host: &str, gpu: Option<&str>, nccl: Result<&str, &str>) -> RankFacts {
        RankFacts {
            host: host.into(),
            backend: if gpu.is_some() { "cuda" } else { "cpu" }.into(),
            gpu: gpu.map(String::from),
            nccl: nccl.map(String::from).map_err(String::from),
        }
    }

    fn why(p: ReducePath) -> String {
        match p {
            ReducePath::Host { why: Some(w) } => w,
            other => panic!("expected host MPI with a reason, got {other:?}"),
        }
    }

    #[test]
    fn a_gpu_per_rank_with_nccl_everywhere_takes_nccl() {
        let f = [
            rank("a", Some("GPU-0"), Ok("2.28.3")),
            rank("a", Some("GPU-1"), Ok("2.28.3")),
            // The same device ordinal on another node is another GPU.
            rank("b", Some("GPU-0"), Ok("2.28.3")),
        ];
        assert_eq!(choose(&f, false), ReducePath::Nccl("2.28.3".into()));
    }

    #[test]
    fn ranks_sharing_a_gpu_use_host_mpi_and_say_which() {
        let f = [
            rank("a", Some("GPU-0"), Ok("2.28.3")),
            rank("a", Some("GPU-0"), Ok("2.28.3")),
            rank("a", Some("GPU-1"), Ok("2.28.3")),
            rank("a", Some("GPU-0"), Ok("2.28.3")),
        ];
        let w = why(choose(&f, false));
        assert_eq!(
            w,
            "ranks 0, 1, 3 share GPU GPU-0 on a (NCCL needs a GPU per rank)"
        );
    }

    #[test]
    fn nccl_missing_on_any_rank_uses_host_mpi() {
        let f = [
            rank("a", Some("GPU-0"), Ok("2.28.3")),
            rank("b", Some("GPU-0"), Err("libnccl.so not found")),
        ];
        let w = why(choose(&f, false));
        assert_eq!(
            w,
            "NCCL cannot be loaded on rank(s) 1: libnccl.so not found"
        );
    }

    #[test]
    fn every_reason_is_named() {
        let f = [
            rank("a", Some("GPU-0"), Err("no lib")),
            rank("a", Some("GPU-0"), Ok("2.27.1")),
            rank("a", Some("GPU-1"), Ok("2.28.3")),
        ];
        let w = why(choose(&f, false));
        assert!(w.contains("rank(s) 0: no lib"), "{w}");
        assert!(
            w.contains("different NCCL versions (2.27.1, 2.28.3)"),
            "{w}"
        );
        assert!(w.contains("ranks 0, 1 share GPU GPU-0 on a"), "{w}");
    }

    #[test]
    fn the_user_can_ask_for_host_mpi() {
        let f = [
            rank("a", Some("GPU-0"), Ok("2.28.3")),
            rank("a", Some("GPU-1"), Ok("2.28.3")),
        ];
        assert_eq!(why(choose(&f, true)), "DPW_NCCL=0 asks for host MPI");
    }

    #[test]
    fn other_backends_use_host_mpi_without_a_warning() {
        let f = [rank("a", None, Err("x")), rank("b", None, Err("x"))];
        assert_eq!(choose(&f, false), ReducePath::Host { why: None });
        // A mix of CUDA and other backends (`--backend auto` on unlike nodes) is worth a warning.
        let f = [
            rank("a", Some("GPU-0"), Ok("2.28.3")),
            rank("b", None, Err("x")),
        ];
        assert!(why(choose(&f, false)).starts_with("rank(s) 1 do not compute on CUDA (cpu)"));
    }

    #[test]
    fn version_codes() {
        assert_eq!(nccl_version(22803), "2.28.3");
        assert_eq!(nccl_version(21903), "2.19.3");
        assert_eq!(nccl_version(2804), "2.8.4");
    }
}
