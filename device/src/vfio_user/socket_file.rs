//! A listening unix socket's files: binding a path that no live server holds, and removing
//! what a bind made once it is no longer wanted. The vfio-user socket and the daemon's control
//! socket are both bound this way.
//!
//! `PATH.lock` beside the socket is locked first (`flock`, exclusive, not waiting): a second
//! daemon on the same path finds it held and stops. With the lock held, a socket file already
//! at the path is probed with a connect: a server answering there (one that does not take the
//! lock) means the path is in use too, a refused connect means a stale socket, which is
//! replaced. Anything but a socket is left alone. Neither file is followed if it is a symbolic
//! link (`O_NOFOLLOW`; the socket file is looked at with `lstat`).
//!
//! The socket appears at its path only once it listens, with the group and mode it was asked
//! for: it is bound in a directory beside it that only this process can enter
//! (`PATH.bind/s`, mode 0700, its name free while the lock is held: anything there is a
//! crashed bind's, and goes), made to listen, given its access, then renamed into place
//! (never over something that appeared there meanwhile). A client that waits for the path to
//! exist therefore never finds a socket that refuses it (`bind` and `listen` are two system
//! calls), nobody can connect while the umask's bits apply, and nobody can swap the staged
//! socket for a symbolic link before its group and mode are set. Only a path too long for the
//! staging name is bound in place, with its access set after.
//!
//! What a bind made is removed if it fails, or if what it bound is dropped before it was
//! served ([`SocketFiles::served`]): nothing is left behind by a refused or failed start. A
//! served socket's file is removed when the server stops; its lock file stays (unlinking it
//! would let two daemons lock two different files of the same name), and the lock ends with
//! the process, however it ends.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, ErrorKind};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use log::info;
use thiserror::Error;

/// Why a socket path could not be bound.
#[derive(Debug, Error)]
pub enum BindError {
    /// Another live server holds the path (its lock file, or it answers on the socket).
    #[error("{path} is in use: served by another live daemon ({how}); not taking it over")]
    InUse {
        /// Socket path.
        path: String,
        /// How that was found.
        how: &'static str,
    },
    /// Something that is not a socket is at the path, or the lock file is not a regular file.
    #[error("{path} exists and is not a {what}; not replacing it")]
    NotASocket {
        /// The path in the way.
        path: String,
        /// What it should have been.
        what: &'static str,
    },
    /// The socket's group or mode could not be set.
    #[error("cannot set {what} of the socket {path}")]
    Access {
        /// Socket path.
        path: String,
        /// "its group" or "its mode".
        what: &'static str,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// A system call failed.
    #[error("cannot listen on {path}")]
    Io {
        /// Socket path.
        path: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

/// Who may connect to a socket: the group and the permission bits its file gets (each if set;
/// connecting to a unix socket needs write permission on its file).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SocketAccess {
    /// The socket file's group.
    pub group: Option<u32>,
    /// The socket file's permission bits.
    pub mode: Option<u32>,
}

impl SocketAccess {
    /// Gives the socket file at `path` this access.
    pub fn apply(&self, path: &Path) -> Result<(), BindError> {
        let err = |what, source| BindError::Access { path: path.display().to_string(), what, source };
        if let Some(gid) = self.group {
            std::os::unix::fs::chown(path, None, Some(gid)).map_err(|e| err("its group", e))?;
        }
        if let Some(mode) = self.mode {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                .map_err(|e| err("its mode", e))?;
        }
        Ok(())
    }
}

/// The files of a bound socket: removed when dropped, as far as this process made them.
#[derive(Debug, Default)]
pub struct SocketFiles {
    /// The socket file, removed when this is dropped or [`Self::remove_socket_file`] is called
    /// (`None`: it stays, or it was removed).
    socket: Option<PathBuf>,
    /// The lock file, if the bind created it and nothing has been served yet: removed when this
    /// is dropped.
    created_lock: Option<PathBuf>,
    /// The lock, held for as long as this lives.
    lock: Option<File>,
    /// The socket file of a socket handed over ([`Self::handed_over`]): this one's to remove
    /// only once it is served (a handover not taken leaves it to the server that has it).
    handed_socket: Option<PathBuf>,
}

impl SocketFiles {
    /// The socket is served from now on: its lock file stays when it stops.
    pub fn served(&mut self) {
        self.created_lock = None;
        if let Some(p) = self.handed_socket.take() {
            self.socket = Some(p);
        }
    }

    /// Leaves the socket file in place (the process's root directory changed after binding:
    /// the path now names something else, or nothing, and the next start replaces the stale
    /// socket).
    pub fn keep_socket_file(&mut self) {
        self.socket = None;
    }

    /// The process's root directory changed after binding and the socket lies beneath the new
    /// root, at `inside` as the process now names it: the file is removed through that path.
    pub fn socket_file_now_at(&mut self, inside: PathBuf) {
        if self.socket.is_some() {
            self.socket = Some(inside);
        }
    }

    /// The same files for a server that takes the socket over (issue 22): the socket file to
    /// remove when it stops (once it serves: dropped before, it removes nothing), and a new
    /// descriptor of the lock (the lock is held while either is open). Once the taker serves,
    /// this one should keep the socket file ([`Self::keep_socket_file`]).
    pub fn handed_over(&self) -> io::Result<SocketFiles> {
        Ok(SocketFiles {
            socket: None,
            created_lock: None,
            lock: self.lock.as_ref().map(File::try_clone).transpose()?,
            handed_socket: self.socket.clone().or_else(|| self.handed_socket.clone()),
        })
    }

    /// The parts another process needs to take this over (issue 22): the socket file it is to
    /// remove once it serves, and the lock's descriptor. This one then removes nothing.
    pub fn into_parts(mut self) -> (Option<PathBuf>, Option<File>) {
        let socket = self.handed_socket.take().or_else(|| self.socket.take());
        self.created_lock = None;
        (socket, self.lock.take())
    }

    /// The files of a socket another process handed over ([`Self::into_parts`] there): the
    /// socket file is this one's to remove once it serves ([`Self::served`]).
    pub fn from_parts(socket: Option<PathBuf>, lock: Option<File>) -> SocketFiles {
        SocketFiles { socket: None, created_lock: None, lock, handed_socket: socket }
    }

    /// Removes the socket file now, if it is still a socket (clients can no longer connect;
    /// the listening socket itself is unaffected).
    pub fn remove_socket_file(&mut self) {
        if let Some(p) = self.socket.take() {
            if std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_socket()) {
                let _ = std::fs::remove_file(&p);
            }
        }
    }
}

impl Drop for SocketFiles {
    fn drop(&mut self) {
        self.remove_socket_file();
        if let Some(lock) = self.created_lock.take() {
            let _ = std::fs::remove_file(lock);
        }
    }
}

/// Binds `path` (see the module's documentation) with the default access (the umask's): the
/// listening socket, non-blocking, and the files it made.
pub fn bind_exclusive(path: &Path) -> Result<(UnixListener, SocketFiles), BindError> {
    bind_exclusive_with(path, SocketAccess::default())
}

/// Binds `path` (see the module's documentation), its socket file appearing with `access`:
/// the listening socket, non-blocking, and the files it made.
pub fn bind_exclusive_with(
    path: &Path,
    access: SocketAccess,
) -> Result<(UnixListener, SocketFiles), BindError> {
    let shown = || path.display().to_string();
    let io_err = |source| BindError::Io { path: shown(), source };
    let mut lock_path: OsString = path.as_os_str().to_owned();
    lock_path.push(".lock");
    let lock_path = PathBuf::from(lock_path);
    let (lock, created) = open_lock(&lock_path).map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) | Some(libc::ENXIO) => {
            BindError::NotASocket { path: lock_path.display().to_string(), what: "regular file" }
        }
        _ => io_err(e),
    })?;
    // From here on, a failed bind removes the lock file it created.
    let mut files = SocketFiles {
        socket: None,
        created_lock: created.then(|| lock_path.clone()),
        lock: None,
        handed_socket: None,
    };
    if !lock.metadata().map_err(io_err)?.file_type().is_file() {
        files.created_lock = None;
        return Err(BindError::NotASocket { path: lock_path.display().to_string(), what: "regular file" });
    }
    match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
            return Err(BindError::InUse { path: shown(), how: "its lock file is held" });
        }
        Err(e) => return Err(io_err(e.into())),
    }
    files.lock = Some(lock);
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(BindError::NotASocket { path: shown(), what: "socket" });
        }
        match UnixStream::connect(path) {
            Ok(_) => return Err(BindError::InUse { path: shown(), how: "it accepts connections" }),
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionRefused | ErrorKind::NotFound) => {
                info!("replacing the stale socket {}", path.display());
                match std::fs::remove_file(path) {
                    Err(e) if e.kind() != ErrorKind::NotFound => return Err(io_err(e)),
                    _ => {}
                }
            }
            Err(e) => return Err(io_err(e)),
        }
    }
    // Staged in a directory of this process's alone (0700; its name is free while the lock
    // is held: anything there is a crashed bind's, removed), so that nobody else can connect
    // to the socket or swap it for a symbolic link before its access is set.
    let mut stage_dir: OsString = path.as_os_str().to_owned();
    stage_dir.push(".bind");
    let stage_dir = PathBuf::from(stage_dir);
    let staged = stage_dir.join("s");
    if staged.as_os_str().len() >= SUN_PATH_MAX {
        // No room for the staging name: bound in place, its access set once it exists.
        let listener = UnixListener::bind(path).map_err(io_err)?;
        files.socket = Some(path.to_path_buf());
        access.apply(path)?;
        listener.set_nonblocking(true).map_err(io_err)?;
        return Ok((listener, files));
    }
    if std::fs::symlink_metadata(&stage_dir).is_ok() {
        // Not followed if it is a symbolic link: only the link goes.
        std::fs::remove_dir_all(&stage_dir)
            .or_else(|_| std::fs::remove_file(&stage_dir))
            .map_err(|e| BindError::Io { path: stage_dir.display().to_string(), source: e })?;
    }
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&stage_dir)
            .map_err(|e| BindError::Io { path: stage_dir.display().to_string(), source: e })?;
    }
    let stage = StageDir(stage_dir);
    let listener = UnixListener::bind(&staged).map_err(io_err)?;
    files.socket = Some(staged.clone());
    access.apply(&staged)?;
    let renamed = rustix::fs::renameat_with(
        rustix::fs::CWD,
        &staged,
        rustix::fs::CWD,
        path,
        rustix::fs::RenameFlags::NOREPLACE,
    );
    let renamed: io::Result<()> = match renamed {
        // A filesystem without RENAME_NOREPLACE: the path was checked free under the lock.
        Err(rustix::io::Errno::INVAL) if std::fs::symlink_metadata(path).is_err() => {
            std::fs::rename(&staged, path)
        }
        r => r.map_err(io::Error::from),
    };
    renamed.map_err(|e| match e.raw_os_error() {
        Some(libc::EEXIST) => BindError::InUse { path: shown(), how: "something else appeared there" },
        _ => io_err(e),
    })?;
    files.socket = Some(path.to_path_buf());
    drop(stage);
    listener.set_nonblocking(true).map_err(io_err)?;
    Ok((listener, files))
}

/// A bind's staging directory, removed (with the staged socket, if it is still there) when
/// the bind ends, however it ends.
struct StageDir(PathBuf);

impl Drop for StageDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0.join("s"));
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The longest socket path plus one: the size of `sun_path`.
const SUN_PATH_MAX: usize = 108;

/// Removes the socket file at `path` if no server holds it (its `PATH.lock` can be locked, or
/// there is none) and it is a socket (a supervisor removing what a confined process it serves
/// cannot reach); whether it removed one.
pub fn remove_unserved(path: &Path) -> io::Result<bool> {
    let mut lock_path: OsString = path.as_os_str().to_owned();
    lock_path.push(".lock");
    let mut o = std::fs::OpenOptions::new();
    o.read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK);
    let _held = match o.open(&lock_path) {
        Ok(lock) => match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Some(lock),
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => return Ok(false),
            Err(e) => return Err(e.into()),
        },
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path).map(|()| true),
        Ok(_) => Ok(false),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Opens (creating it if need be) a lock file without following a symbolic link; whether this
/// call created it.
fn open_lock(path: &Path) -> io::Result<(File, bool)> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true).write(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK);
    match o.clone().create_new(true).mode(0o600).open(path) {
        Ok(f) => return Ok((f, true)),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    o.open(path).map(|f| (f, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bind that fails leaves no lock file it made; a socket bound and dropped unserved
    /// leaves nothing; one served leaves its lock file only.
    #[test]
    fn what_a_bind_made_goes_unless_served() {
        let dir = tempfile::tempdir().unwrap();
        let lock = |name: &str| dir.path().join(format!("{name}.lock"));
        // In the way: a regular file at the socket's path.
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(bind_exclusive(&file), Err(BindError::NotASocket { .. })));
        assert!(!lock("file").exists(), "a failed bind left its lock file");
        assert_eq!(std::fs::read(&file).unwrap(), b"x");
        // A symbolic link as the lock file is not followed, and not removed.
        let target = dir.path().join("target");
        std::os::unix::fs::symlink(&target, lock("link")).unwrap();
        assert!(matches!(bind_exclusive(&dir.path().join("link")), Err(BindError::NotASocket { .. })));
        assert!(!target.exists(), "the lock file's symbolic link was followed");
        assert!(std::fs::symlink_metadata(lock("link")).is_ok());
        // Dropped unserved: both files go.
        let sock = dir.path().join("sock");
        let (l, files) = bind_exclusive(&sock).unwrap();
        assert!(sock.exists() && lock("sock").exists());
        // A second bind of the same path finds it held.
        assert!(matches!(bind_exclusive(&sock), Err(BindError::InUse { .. })));
        drop((l, files));
        assert!(!sock.exists() && !lock("sock").exists());
        // Served: the lock file stays.
        let (l, mut files) = bind_exclusive(&sock).unwrap();
        files.served();
        drop((l, files));
        assert!(!sock.exists() && lock("sock").exists());
        // Handed over: dropped before it serves, the copy removes nothing; served, it removes
        // the socket file when it goes.
        let (l, mut files) = bind_exclusive(&sock).unwrap();
        files.served();
        let handed = files.handed_over().unwrap();
        drop(handed);
        assert!(sock.exists(), "a handover not taken removed the socket file");
        let mut taken = files.handed_over().unwrap();
        files.keep_socket_file();
        drop((l, files));
        assert!(sock.exists());
        taken.served();
        drop(taken);
        assert!(!sock.exists(), "the taker left the socket file behind");
        // The lock file a bind did not create stays whatever happens.
        let (l, files) = bind_exclusive(&sock).unwrap();
        drop((l, files));
        assert!(lock("sock").exists());
    }

    /// The socket appears at its path listening and with its access: a connect as soon as the
    /// path exists is accepted, and the mode is the one asked for, whatever the umask. Nothing
    /// of the staging name is left; a path too long for it is bound in place.
    #[test]
    fn the_socket_appears_listening_with_its_access() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s");
        let access = SocketAccess { group: None, mode: Some(0o600) };
        let (l, files) = bind_exclusive_with(&sock, access).unwrap();
        UnixStream::connect(&sock).expect("listening once it is there");
        let mode = std::fs::symlink_metadata(&sock).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 2, "the socket and its lock only: {names:?}");
        drop((l, files));
        // A crashed bind's staging directory is replaced; a symbolic link there is not
        // followed (only the link goes).
        let stage = dir.path().join("s.bind");
        std::fs::create_dir(&stage).unwrap();
        drop(UnixListener::bind(stage.join("s")).unwrap());
        let (l, files) = bind_exclusive_with(&sock, access).unwrap();
        assert!(!stage.exists());
        drop((l, files));
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join("keep"), b"x").unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), &stage).unwrap();
        let (l, files) = bind_exclusive_with(&sock, access).unwrap();
        assert!(elsewhere.path().join("keep").exists(), "the link was followed");
        assert!(std::fs::symlink_metadata(&stage).is_err());
        drop((l, files));
        // No room for the suffix: bound in place, with its access all the same.
        let long = dir.path().join("x".repeat(SUN_PATH_MAX - 2 - dir.path().as_os_str().len()));
        assert!(long.as_os_str().len() < SUN_PATH_MAX);
        let (_l, _files) = bind_exclusive_with(&long, access).unwrap();
        UnixStream::connect(&long).unwrap();
        let mode = std::fs::symlink_metadata(&long).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o600);
    }
}
