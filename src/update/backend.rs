//! A function's backend in a live update: what a running backend gives at its function's
//! quiet point ([`SavesState`]), and the backend a new process builds from it ([`restore`]).
//!
//! Only the RAM filesystem moves yet: its file data stays where it is (the memfd the next
//! process maps), its metadata, open handles and FUSE session (INIT's flags, the locks held)
//! travel as data. A shared directory or an NFS export has no [`SavesState`], so a daemon
//! serving one refuses the update and serves on.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use virtiofs_backend::ramfs::RamFsConfig;
use virtiofs_backend::server::ServerOptions;
use virtiofs_backend::RamFs;

use super::state::BackendPart;
use crate::backends::Built;
use crate::FuseHandler;

/// A backend that can give its state to a successor.
pub trait SavesState: Send + Sync {
    /// Its state and descriptors; called while its function is at the quiet point (no request
    /// runs). `Err`: it cannot be handed over now (a SETLKW waits), and why.
    fn save(&self) -> Result<(BackendPart, Vec<OwnedFd>), String>;

    /// The successor serves now: leave what it shares with this process (a memfd's data)
    /// untouched from here on, also as this process ends.
    fn handed_over(&self);
}

impl SavesState for FuseHandler<RamFs> {
    fn save(&self) -> Result<(BackendPart, Vec<OwnedFd>), String> {
        let server = self.server();
        let session = server
            .save_session()
            .ok_or("a SETLKW waits for a lock (waiting requests are not handed over yet)")?;
        let fs = server.filesystem();
        let memfd = fs.data_memfd().try_clone_to_owned().map_err(|e| format!("the data memfd: {e}"))?;
        Ok((BackendPart::Ramfs { fs: Box::new(fs.save()), session }, vec![memfd]))
    }

    fn handed_over(&self) {
        self.server().filesystem().give_data_away();
    }
}

/// The backend of a function taken over: a RAM filesystem of `cfg` (its limits from the new
/// process's own description of the function) restored from `part` with its data memfd.
pub fn restore(
    options: ServerOptions,
    cfg: RamFsConfig,
    part: BackendPart,
    memfd: File,
) -> Result<Built, String> {
    let BackendPart::Ramfs { fs, session } = part;
    let fs =
        RamFs::restore(cfg, &fs, memfd).map_err(|e| format!("RAM filesystem: {}", crate::error_chain(&e)))?;
    let h = Arc::new(FuseHandler::with_options(fs, options));
    h.server().restore_session(&session).map_err(|e| format!("FUSE session: {e}"))?;
    let s = h.clone();
    Ok(Built { handler: h.clone(), fuse: Arc::new(move || s.stats()), descriptors: 0, saver: Some(h) })
}
