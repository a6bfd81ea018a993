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
use virtiofs_backend::passthrough::keep::{DescriptorKeeper, HeldItem, ShareKeep};
use virtiofs_backend::passthrough::state::{Held, PassthroughRestoring};
use virtiofs_backend::passthrough::uring::IoMode;
use virtiofs_backend::passthrough::PassthroughConfig;
use virtiofs_backend::ramfs::state::{Restoring, StateError};
use virtiofs_backend::ramfs::RamFsConfig;
use virtiofs_backend::server::ServerOptions;
use virtiofs_backend::{PassthroughFs, RamFs};

use virtiofs_backend::filesystem::FileSystem;
use virtiofs_backend::server::SessionState;
use virtiofs_backend::session_record::SessionRecord;

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

/// What [`SavesState::save`] and [`SavesState::precopy`] give: the backend's part and its
/// descriptors.
pub type Saved = Result<(BackendPart, Box<dyn GivenFiles>), String>;

/// A backend that can give its state to a successor.
pub trait SavesState: Send + Sync {
    /// A copy of its state taken while it serves, ahead of the quiet point, so that
    /// [`SavesState::save`] gives only what changed since (format 3); `None` for a backend
    /// that gives everything at the quiet point.
    fn precopy(&self) -> Option<Saved> {
        None
    }

    /// The update the copy was for is called off: stop keeping track of changes.
    fn forget_precopy(&self) {}

    /// The update is called off, after [`SavesState::save`] or before it: the backend serves on
    /// as it did (what the save held back goes again).
    fn called_off(&self) {}

    /// Its state and descriptors; called while its function is at the quiet point (no request
    /// runs; a SETLKW may wait: it is state). After a [`SavesState::precopy`], only what
    /// changed since. `Err`: it cannot be handed over now, and why.
    fn save(&self) -> Saved;

    /// The successor serves now: leave what it shares with this process (a memfd's data)
    /// untouched from here on, also as this process ends.
    fn handed_over(&self);

    /// In the successor, once the predecessor has let go (the commit): what the two shared
    /// (a memfd's data) is this process's to change now. Before it, a successor that is
    /// dropped leaves it untouched for the predecessor, which serves on.
    fn taken_over(&self) {}

    /// In the predecessor, once every function was taken and just before the commit is sent:
    /// what it shares with the successor and still wrote (an NFS export's records) is not
    /// written by this process any more. An update called off never gets here (the functions
    /// that serve on go on writing).
    fn committed(&self) {}

    /// What a crash checkpoint carries of the backend (issue 24): the part and the descriptors
    /// of the records it keeps its state in as it changes, from which a process started after
    /// a crash recovers it; `None` for a backend whose state is not kept (it ends: `Fresh`).
    fn kept(&self) -> Option<Result<(BackendPart, Vec<OwnedFd>), String>> {
        None
    }

    /// Keeps the backend's state for a crash from now on, its descriptors held by `keeper`
    /// (the supervisor), where the backend needs that (a shared directory); called before the
    /// function serves. Nothing for the others.
    fn keep_descriptors(&self, _keeper: Arc<dyn DescriptorKeeper>) -> Result<(), String> {
        Ok(())
    }
}

fn ramfs_memfd(fs: &RamFs) -> Result<Vec<OwnedFd>, String> {
    Ok(vec![fs.data_memfd().try_clone_to_owned().map_err(|e| format!("the data memfd: {e}"))?])
}

impl SavesState for FuseHandler<RamFs> {
    /// The metadata, copied while the function serves (file data stays in the memfd).
    fn precopy(&self) -> Option<Saved> {
        let fs = self.server().filesystem();
        Some(ramfs_memfd(fs).map(|memfd| {
            let part = BackendPart::RamfsCopy { fs: Box::new(fs.precopy()) };
            (part, Box::new(memfd) as Box<dyn GivenFiles>)
        }))
    }

    fn forget_precopy(&self) {
        self.server().filesystem().forget_precopy();
    }

    /// After a copy, what changed since; else the whole filesystem (format 2).
    fn save(&self) -> Saved {
        let server = self.server();
        let session = server.save_session();
        let fs = server.filesystem();
        if let Some(changes) = fs.changes() {
            return Ok((
                BackendPart::RamfsChanges { changes: Box::new(changes), session },
                Box::new(Vec::new()),
            ));
        }
        Ok((BackendPart::Ramfs { fs: Box::new(fs.save()), session }, Box::new(ramfs_memfd(fs)?)))
    }

    fn handed_over(&self) {
        self.server().filesystem().give_data_away();
    }

    fn taken_over(&self) {
        self.server().filesystem().take_data_back();
    }
}

impl SavesState for FuseHandler<PassthroughFs> {
    /// The node table and handles with their descriptors, copied while the function serves.
    fn precopy(&self) -> Option<Saved> {
        let (fs, held) = self.server().filesystem().precopy();
        Some(Ok((BackendPart::PassthroughCopy { fs: Box::new(fs) }, Box::new(held))))
    }

    fn forget_precopy(&self) {
        self.server().filesystem().forget_precopy();
    }

    /// After a copy, what changed since; else the whole share (format 2).
    fn save(&self) -> Saved {
        let server = self.server();
        let session = server.save_session();
        if let Some((changes, held)) = server.filesystem().changes() {
            let part = BackendPart::PassthroughChanges { changes: Box::new(changes), session };
            return Ok((part, Box::new(held)));
        }
        let (fs, held) = server.filesystem().save();
        Ok((BackendPart::Passthrough { fs: Box::new(fs), session }, Box::new(held)))
    }

    /// Nothing is shared but the host's files, which the new process now holds too; the
    /// records kept for a crash stay as they are (the supervisor may still recover from them
    /// until the new process's own come) while this share goes away.
    fn handed_over(&self) {
        if let Some(k) = self.server().filesystem().kept() {
            k.detach();
        }
    }

    /// The nodes' records and the session's record (the supervisor fills in what it holds).
    fn kept(&self) -> Option<Result<(BackendPart, Vec<OwnedFd>), String>> {
        let keep = self.server().filesystem().kept()?;
        let session = self.server().session_record()?;
        Some((|| {
            let records =
                keep.memfd().try_clone_to_owned().map_err(|e| format!("the share's records: {e}"))?;
            let session =
                session.memfd().try_clone_to_owned().map_err(|e| format!("the session record: {e}"))?;
            Ok((BackendPart::PassthroughKept { held: Vec::new(), incomplete: false }, vec![records, session]))
        })())
    }

    /// New records (unless a recovery reopened them) and the session's, every node and handle
    /// held by `keeper`.
    fn keep_descriptors(&self, keeper: Arc<dyn DescriptorKeeper>) -> Result<(), String> {
        let server = self.server();
        let fs = server.filesystem();
        if fs.kept().is_some() {
            return Ok(());
        }
        let cfg = fs.config();
        let keep = ShareKeep::create(cfg.max_nodes.saturating_add(cfg.max_handles))
            .map_err(|e| format!("the share's records: {e}"))?;
        keep.set_keeper(keeper);
        if server.session_record().is_none() {
            server.keep_session(Arc::new(
                SessionRecord::new().map_err(|e| format!("the session record: {e}"))?,
            ));
        }
        fs.keep_in(Arc::new(keep), &Default::default());
        Ok(())
    }
}

impl SavesState for FuseHandler<NfsFs> {
    fn save(&self) -> Saved {
        let server = self.server();
        let session = server.save_session();
        let (fs, data) = server.filesystem().save()?;
        let mut fds = vec![OwnedFd::from(data)];
        // The records its tables are kept in for a crash go on in the successor.
        if let Some(files) = server.filesystem().kept_files() {
            let (records, _) = files.map_err(|e| {
                server.filesystem().called_off();
                format!("the NFS records: {e}")
            })?;
            fds.push(OwnedFd::from(records));
        }
        Ok((BackendPart::Nfs { fs: Box::new(fs), session }, Box::new(fds)))
    }

    /// The SETLKWs waiting on an NFSv4.1 server are tried here again.
    fn called_off(&self) {
        self.server().filesystem().called_off();
    }

    /// The new process holds the mount now: this one does not unmount it as it ends.
    fn handed_over(&self) {
        self.server().filesystem().give_away();
    }

    /// The successor writes the records now.
    fn committed(&self) {
        self.server().filesystem().stop_keeping();
    }

    /// The records are this process's to write from now on.
    fn taken_over(&self) {
        self.server().filesystem().take_records();
    }

    /// The UNSTABLE store's memfd, the tables' records and the session's record.
    fn kept(&self) -> Option<Result<(BackendPart, Vec<OwnedFd>), String>> {
        let files = self.server().filesystem().kept_files()?;
        let session = self.server().session_record()?;
        Some((|| {
            let (records, data) = files.map_err(|e| format!("the NFS records: {e}"))?;
            let session =
                session.memfd().try_clone_to_owned().map_err(|e| format!("the session record: {e}"))?;
            Ok((BackendPart::NfsKept, vec![OwnedFd::from(data), OwnedFd::from(records), session]))
        })())
    }
}

fn ramfs_error(e: StateError) -> String {
    format!("RAM filesystem: {}", crate::error_chain(&e))
}

/// A RAM filesystem of `cfg` (its limits from the new process's own description of the
/// function) being built from the copy `part` with its data memfd, while the old process
/// serves.
pub fn restore_copy(cfg: RamFsConfig, part: BackendPart, memfd: File) -> Result<Restoring, String> {
    let BackendPart::RamfsCopy { fs } = part else {
        return Err("its copy is not a RAM filesystem's".into());
    };
    Restoring::new(cfg, &fs, memfd).map_err(ramfs_error)
}

/// Where a RAM filesystem taken over comes from: the whole state's data memfd (format 2), or
/// the filesystem built from a copy (format 3).
pub enum RamfsFrom {
    /// The memfd of a whole state's data.
    Whole(File),
    /// The filesystem built from the copy, the changes still to apply.
    Copy(Box<Restoring>),
}

/// The backend of a function taken over: a RAM filesystem of `cfg` restored from `part`, a
/// whole state or the changes since a copy.
pub fn restore(
    options: ServerOptions,
    cfg: RamFsConfig,
    part: BackendPart,
    from: RamfsFrom,
) -> Result<Built, String> {
    let (fs, session) = match (part, from) {
        (BackendPart::Ramfs { fs, session }, RamfsFrom::Whole(memfd)) => {
            (RamFs::restore(cfg, &fs, memfd).map_err(ramfs_error)?, session)
        }
        (BackendPart::RamfsChanges { changes, session }, RamfsFrom::Copy(base)) => {
            (base.finish(Some(&changes)).map_err(ramfs_error)?, session)
        }
        (BackendPart::RamfsChanges { .. }, RamfsFrom::Whole(_)) => {
            return Err("its changes came without a copy to apply them to".into())
        }
        _ => return Err("its state is not a RAM filesystem's".into()),
    };
    serve(fs, options, &session, 0, FuseHandler::stats, None)
}

/// The handler of a restored filesystem `fs`, its FUSE session taken over from `session`;
/// `stats` reads its statistics.
fn serve<F>(
    fs: F,
    options: ServerOptions,
    session: &SessionState,
    descriptors: u64,
    stats: fn(&FuseHandler<F>) -> crate::FuseStats,
    record: Option<SessionRecord>,
) -> Result<Built, String>
where
    F: FileSystem + 'static,
    FuseHandler<F>: SavesState,
{
    let h = Arc::new(FuseHandler::with_options(fs, options));
    h.server().restore_session(session).map_err(|e| format!("FUSE session: {e}"))?;
    if let Some(r) = record {
        // Kept for a crash from here on, starting with the session taken over.
        h.server().keep_session(Arc::new(r));
    }
    let s = h.clone();
    Ok(Built { handler: h.clone(), fuse: Arc::new(move || stats(&s)), descriptors, saver: Some(h) })
}

/// A shared directory (`cfg`, its root as this process names it) being built from the copy
/// `part` with its descriptors while the old process serves, reopening nodes through
/// `proc_fd`.
pub fn restore_passthrough_copy(
    cfg: PassthroughConfig,
    proc_fd: OwnedFd,
    part: BackendPart,
    files: Vec<File>,
) -> Result<PassthroughRestoring, String> {
    let BackendPart::PassthroughCopy { fs } = part else {
        return Err("its copy is not a shared directory's".into());
    };
    PassthroughFs::restore_copy(cfg, proc_fd, &fs, files).map_err(|e| crate::error_chain(&e))
}

/// The backend of a function taken over: the shared directory `cfg` describes (its root as
/// this process names it), restored from `part` with its descriptors — a whole state,
/// reopening nodes through `proc_fd`, or the changes since a copy built as `copy`.
pub fn restore_passthrough(
    options: ServerOptions,
    cfg: PassthroughConfig,
    io_mode: IoMode,
    proc_fd: OwnedFd,
    part: BackendPart,
    files: Vec<File>,
    copy: Option<PassthroughRestoring>,
) -> Result<Built, String> {
    let (mut fs, session) = match (part, copy) {
        (BackendPart::Passthrough { fs, session }, _) => {
            (PassthroughFs::restore(cfg, proc_fd, &fs, files).map_err(|e| crate::error_chain(&e))?, session)
        }
        (BackendPart::PassthroughChanges { changes, session }, Some(base)) => {
            (base.finish(&changes, files).map_err(|e| crate::error_chain(&e))?, session)
        }
        (BackendPart::PassthroughChanges { .. }, None) => {
            return Err("its changes came without a copy to apply them to".into())
        }
        _ => return Err("its state is not a shared directory's".into()),
    };
    fs.set_io_mode(io_mode);
    let descriptors = fs.descriptor_limit();
    serve(
        fs,
        options,
        &session,
        descriptors,
        |s| crate::FuseStats { io: Some(s.server().filesystem().engine_stats()), ..s.stats() },
        None,
    )
}

/// The shared directory of a function whose serving process was killed (issue 24), `cfg`
/// (its root as this process names it), from the nodes' `records`, the descriptors the
/// supervisor `held` (`files`, in the same order) and the FUSE `session`'s record; nodes are
/// reopened through `proc_fd`, and `keeper` holds them from now on. `Err`: the function then
/// ends as one whose state was lost.
#[allow(clippy::too_many_arguments)]
pub fn recover_passthrough(
    options: ServerOptions,
    cfg: PassthroughConfig,
    io_mode: IoMode,
    proc_fd: OwnedFd,
    held: &[(u64, HeldItem)],
    records: File,
    session: File,
    files: Vec<File>,
    keeper: Option<Arc<dyn DescriptorKeeper>>,
) -> Result<Built, String> {
    let record = SessionRecord::open(session)?;
    let state = record.read()?.ok_or("no FUSE session was kept (none began, or it outgrew its record)")?;
    let keep = ShareKeep::open(records)?;
    keep.set_keeper(keeper.ok_or("no supervisor holds its descriptors")?);
    let r = PassthroughFs::recover(cfg, proc_fd, &keep, held, files, state.negotiated)
        .map_err(|e| crate::error_chain(&e))?;
    let mut fs = r.fs;
    fs.set_io_mode(io_mode);
    let keep = Arc::new(keep);
    fs.keep_in(keep.clone(), &r.slots);
    keep.let_go(&r.dropped);
    let descriptors = fs.descriptor_limit();
    serve(
        fs,
        options,
        &state,
        descriptors,
        |s| crate::FuseStats { io: Some(s.server().filesystem().engine_stats()), ..s.stats() },
        Some(record),
    )
}

/// The backend of a function taken over: the NFS export `opts` names, restored from `part`
/// with the memfd of its UNSTABLE store's bytes.
pub fn restore_nfs(
    options: ServerOptions,
    opts: NfsOptions,
    part: BackendPart,
    data: File,
    records: Option<File>,
) -> Result<Built, String> {
    let BackendPart::Nfs { fs, session } = part else {
        return Err("its state is not an NFS export's".into());
    };
    let record =
        opts.keep.then(SessionRecord::new).transpose().map_err(|e| format!("the session record: {e}"))?;
    let fs = NfsFs::restore(opts, &fs, data, records)?;
    serve(fs, options, &session, 0, nfs_stats, record)
}

fn nfs_stats(s: &FuseHandler<NfsFs>) -> crate::FuseStats {
    crate::FuseStats { nfs: Some(s.server().filesystem().stats()), ..s.stats() }
}

/// The NFS export of a function whose serving process was killed (issue 24), from the records
/// it kept: `data` (the UNSTABLE store's bytes), `records` (the tables), `session` (the FUSE
/// session). `Err` when the records do not hold together or keep no session: the function
/// then ends as one whose state was lost.
pub fn recover_nfs(
    options: ServerOptions,
    opts: NfsOptions,
    data: File,
    records: File,
    session: File,
) -> Result<Built, String> {
    let record = SessionRecord::open(session)?;
    let session = record.read()?.ok_or("no FUSE session was kept (none began, or it outgrew its record)")?;
    let fs = NfsFs::recover(opts, data, records)?;
    serve(fs, options, &session, 0, nfs_stats, Some(record))
}
