//! Replays every checked-in fuzz input on stable: the corpora the fuzzers built
//! (`fuzz/corpus/<target>/`) and the inputs of crashes found and fixed
//! (`fuzz/regressions/<target>/`, one file per finding, named after it). Each input goes through
//! the same body the fuzz target runs (`fuzz/common/src/lib.rs`, compiled here by path: the
//! fuzz crates are a workspace of their own), so a regression fails here in `cargo test`
//! without nightly or libFuzzer.

use std::path::{Path, PathBuf};

#[path = "../fuzz/common/src/lib.rs"]
mod virtiofs_fuzz_common;

fn inputs(target: &str) -> Vec<PathBuf> {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut all = Vec::new();
    for kind in ["corpus", "regressions"] {
        let dir = fuzz.join(kind).join(target);
        if let Ok(entries) = std::fs::read_dir(&dir) {
            all.extend(entries.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_file()));
        }
    }
    all.sort();
    all
}

fn replay(target: &str, body: fn(&[u8])) {
    let files = inputs(target);
    assert!(!files.is_empty(), "no checked-in inputs for {target}");
    for f in &files {
        let data = std::fs::read(f).unwrap();
        let r = std::panic::catch_unwind(|| body(&data));
        assert!(r.is_ok(), "{target}: input {} panicked", f.display());
    }
    eprintln!("{target}: {} inputs replayed", files.len());
}

#[test]
fn vfio_user() {
    replay("vfio_user", virtiofs_fuzz_common::vfio_user);
}

#[test]
fn virtq() {
    replay("virtq", virtiofs_fuzz_common::virtq);
}

#[test]
fn fuse_ramfs() {
    replay("fuse_ramfs", virtiofs_fuzz_common::fuse_ramfs);
}

#[test]
fn fuse_passthrough() {
    replay("fuse_passthrough", virtiofs_fuzz_common::fuse_passthrough);
}

#[test]
fn nfs_reply() {
    replay("nfs_reply", virtiofs_fuzz_common::nfs_reply);
}

#[test]
fn nfs4_reply() {
    replay("nfs4_reply", virtiofs_fuzz_common::nfs4_reply);
}
