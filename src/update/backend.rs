//! A function's backend in a live update: what a running backend gives at its function's
//! quiet point ([`SavesState`]), and the backend a new process builds from it ([`restore`]).
//!
//! A RAM filesystem's file data stays where it is (the memfd the next process maps); its
//! metadata, open handles and FUSE session (INIT's flags, the locks held) travel as data. A
//! shared directory's nodes and open files travel as the descriptors they are, with the node
//! table as data. An NFS export's mount, node table, handles and UNSTABLE store travel as data
//! (the store's bytes in a memfd); the new process connects to the server as at start.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use virtiofs_backend::nfs::fs::{NfsFs, NfsOptions};
use virtiofs_backend::passthrough::state::Held;
use virtiofs_backend::passthrough::uring::IoMode;
use virtiofs_backend::passthrough::PassthroughConfig;
use virtiofs_backend::ramfs::RamFsConfig;
use virtiofs_backend::server::ServerOptions;
use virtiofs_backend::{PassthroughFs, RamFs};

use virtiofs_backend::filesystem::FileSystem;
use virtiofs_backend::server::SessionState;

use super::state::BackendPart;
use crate::backends::Built;
use crate::FuseHandler;

/// What holds a saved backend's descriptors until they are sent.
pub trait GivenFiles: Send {
    /// The descriptors, in the order the state names them.
    fn fds(&self) -> Vec<BorrowedFd<'_>>;
}

impl GivenFiles for Vec<OwnedFd> {
    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        self.iter().map(|f| f.as_fd()).collect()
    }
}

impl GivenFiles for Held {
    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        Held::fds(self)
    }
}

/// A backend that can give its state to a successor.
pub trait SavesState: Send + Sync {
    /// Its state and descriptors; called while its function is at the quiet point (no request
    /// runs; a SETLKW may wait: it is state). `Err`: it cannot be handed over now, and why.
    fn save(&self) -> Result<(BackendPart, Box<dyn GivenFiles>), String>;

    /// The successor serves now: leave what it shares with this process (a memfd's data)
    /// untouched from here on, also as this process ends.
    fn handed_over(&self);
}

impl SavesState for FuseHandler<RamFs> {
    fn save(&self) -> Result<(BackendPart, Box<dyn GivenFiles>), String> {
        let server = self.server();
        let session = server.save_session();
        let fs = server.filesystem();
        let memfd = fs.data_memfd().try_clone_to_owned().map_err(|e| format!("the data memfd: {e}"))?;
        Ok((BackendPart::Ramfs { fs: Box::new(fs.save()), session }, Box::new(vec![memfd])))
    }

    fn handed_over(&self) {
        self.server().filesystem().give_data_away();
    }
}

impl SavesState for FuseHandler<PassthroughFs> {
    fn save(&self) -> Result<(BackendPart, Box<dyn GivenFiles>), String> {
        let server = self.server();
        let session = server.save_session();
        let (fs, held) = server.filesystem().save();
        Ok((BackendPart::Passthrough { fs: Box::new(fs), session }, Box::new(held)))
    }

    /// Nothing is shared but the host's files, which the new process now holds too.
    fn handed_over(&self) {}
}

impl SavesState for FuseHandler<NfsFs> {
    fn save(&self) -> Result<(BackendPart, Box<dyn GivenFiles>), String> {
        let server = self.server();
        let session = server.save_session();
        let (fs, data) = server.filesystem().save()?;
        Ok((BackendPart::Nfs { fs: Box::new(fs), session }, Box::new(vec![OwnedFd::from(data)])))
    }

    /// The new process holds the mount now: this one does not unmount it as it ends.
    fn handed_over(&self) {
        self.server().filesystem().give_away();
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
    let BackendPart::Ramfs { fs, session } = part else {
        return Err("its state is not a RAM filesystem's".into());
    };
    let fs =
        RamFs::restore(cfg, &fs, memfd).map_err(|e| format!("RAM filesystem: {}", crate::error_chain(&e)))?;
    serve(fs, options, &session, 0, FuseHandler::stats)
}

/// The handler of a restored filesystem `fs`, its FUSE session taken over from `session`;
/// `stats` reads its statistics.
fn serve<F>(
    fs: F,
    options: ServerOptions,
    session: &SessionState,
    descriptors: u64,
    stats: fn(&FuseHandler<F>) -> crate::FuseStats,
) -> Result<Built, String>
where
    F: FileSystem + 'static,
    FuseHandler<F>: SavesState,
{
    let h = Arc::new(FuseHandler::with_options(fs, options));
    h.server().restore_session(session).map_err(|e| format!("FUSE session: {e}"))?;
    let s = h.clone();
    Ok(Built { handler: h.clone(), fuse: Arc::new(move || stats(&s)), descriptors, saver: Some(h) })
}

/// The backend of a function taken over: the shared directory `cfg` describes (its root as
/// this process names it), restored from `part` with its descriptors, reopening nodes through
/// `proc_fd`.
pub fn restore_passthrough(
    options: ServerOptions,
    cfg: PassthroughConfig,
    io_mode: IoMode,
    proc_fd: OwnedFd,
    part: BackendPart,
    files: Vec<File>,
) -> Result<Built, String> {
    let BackendPart::Passthrough { fs, session } = part else {
        return Err("its state is not a shared directory's".into());
    };
    let mut fs = PassthroughFs::restore(cfg, proc_fd, &fs, files).map_err(|e| crate::error_chain(&e))?;
    fs.set_io_mode(io_mode);
    let descriptors = fs.descriptor_limit();
    serve(fs, options, &session, descriptors, |s| crate::FuseStats {
        io: Some(s.server().filesystem().engine_stats()),
        ..s.stats()
    })
}

/// The backend of a function taken over: the NFS export `opts` names, restored from `part`
/// with the memfd of its UNSTABLE store's bytes.
pub fn restore_nfs(
    options: ServerOptions,
    opts: NfsOptions,
    part: BackendPart,
    data: File,
) -> Result<Built, String> {
    let BackendPart::Nfs { fs, session } = part else {
        return Err("its state is not an NFS export's".into());
    };
    let fs = NfsFs::restore(opts, &fs, data)?;
    serve(fs, options, &session, 0, |s| crate::FuseStats {
        nfs: Some(s.server().filesystem().stats()),
        ..s.stats()
    })
}
