//! A dpw built without the `mpi` feature, started by an MPI launcher with more than one process
//! (seen here through the launcher's environment), must stop and say how to build with MPI
//! rather than train N copies that overwrite each other's files.
//!
//! The refusal itself is checked in every build; the binary's behaviour only in a build without
//! the feature (`cargo test`, `scripts/test-all.sh --quick`): CI's build has MPI.

use dpw::dist::refuse_launcher_world_without_mpi;

#[test]
fn a_launcher_world_of_more_than_one_process_is_refused_with_the_build_hint() {
    let e = refuse_launcher_world_without_mpi(Some(2)).unwrap_err();
    let msg = format!("{e:#}");
    assert!(msg.starts_with("2 processes: "), "{msg}");
    assert!(
        msg.contains("cargo build --release --features mpi"),
        "{msg}"
    );
    for serial in [None, Some(0), Some(1)] {
        assert!(
            refuse_launcher_world_without_mpi(serial).is_ok(),
            "{serial:?}"
        );
    }
}

#[cfg(not(feature = "mpi"))]
#[test]
fn without_the_feature_a_launcher_world_gets_the_build_hint() {
    let d = tempfile::tempdir().unwrap();
    for var in ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dpw"))
            .args(["train", "input.json"])
            .env(var, "2")
            .current_dir(d.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{var}: {err}");
        assert!(
            err.contains("cargo build --release --features mpi"),
            "{var}: {err}"
        );
        assert!(
            std::fs::read_dir(d.path()).unwrap().next().is_none(),
            "wrote files"
        );
    }
    // A launcher world of one process is an ordinary serial run (here: no input.json).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dpw"))
        .args(["train", "input.json"])
        .env("OMPI_COMM_WORLD_SIZE", "1")
        .current_dir(d.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("--features mpi"), "{err}");
}
