//! What several daemon tests share: the daemon binary, a guard that ends a daemon however a
//! test ends, and a wait for a path to appear. Each test binary includes it (`mod common;`)
//! and uses what it needs.
#![allow(dead_code)] // not every test binary uses every item

pub mod crash;

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

/// The daemon binary Cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_virtiofs-dpu");

/// A daemon process, killed and reaped when dropped.
pub struct Daemon(pub Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits (at most 10 s, else the test fails) until `path` exists.
pub fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} did not appear", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}
