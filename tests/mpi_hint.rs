//! A dpw built without the `mpi` feature, started by an MPI launcher with more than one process
//! (seen here through the launcher's environment), must stop and say how to build with MPI
//! rather than train N copies that overwrite each other's files.
#![cfg(not(feature = "mpi"))]

use std::process::Command;

#[test]
fn without_the_feature_a_launcher_world_gets_the_build_hint() {
    let d = tempfile::tempdir().unwrap();
    for var in ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"] {
        let out = Command::new(env!("CARGO_BIN_EXE_dpw"))
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
    let out = Command::new(env!("CARGO_BIN_EXE_dpw"))
        .args(["train", "input.json"])
        .env("OMPI_COMM_WORLD_SIZE", "1")
        .current_dir(d.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("--features mpi"), "{err}");
}
