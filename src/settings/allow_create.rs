//! What `create_function` may use (`--allow-create`): without the flag the method is off; with
//! it, a function's `shared_dir` must lie beneath an allowed share root, its `socket_path` in an
//! allowed socket directory, and its `remote` on an allowed host.
//!
//! The flag is repeatable, each time a comma-separated list of `KIND=VALUE`:
//! `--allow-create roots=/srv/shares,sockets=/run/vfdpu --allow-create remotes=10.0.0.5`.
//! `roots` and `sockets` name existing directories, canonicalized when the daemon starts; a
//! function's paths are canonicalized when it is created, and it is then started on the
//! canonical paths (a symbolic link cannot lead it elsewhere afterwards).

use std::io::ErrorKind;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{BackendSpec, FunctionSpec, Socket};

/// The share roots, socket directories and remote hosts `create_function` may use.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AllowCreate {
    /// `roots=DIR`: a `shared_dir` must be this directory or beneath it.
    pub roots: Vec<PathBuf>,
    /// `sockets=DIR`: a `socket_path` must be a name in this directory.
    pub sockets: Vec<PathBuf>,
    /// `remotes=HOST`: a `remote`'s host must be this one (as the URL names it; every host of
    /// a URL with several must be allowed).
    pub remotes: Vec<String>,
}

impl AllowCreate {
    /// Every `--allow-create` argument, read (`None`: none given, `create_function` is off).
    pub fn from_args(args: &[String]) -> Result<Option<AllowCreate>, String> {
        if args.is_empty() {
            return Ok(None);
        }
        let mut a = AllowCreate::default();
        for arg in args {
            a.add(arg)?;
        }
        Ok(Some(a))
    }

    /// Adds one `--allow-create` argument (`KIND=VALUE[,KIND=VALUE...]`).
    pub fn add(&mut self, arg: &str) -> Result<(), String> {
        for item in arg.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (kind, value) = item.split_once('=').ok_or_else(|| {
                format!("--allow-create {item:?}: expected roots=DIR, sockets=DIR or remotes=HOST")
            })?;
            let value = value.trim();
            if value.is_empty() {
                return Err(format!("--allow-create {kind}=: empty"));
            }
            match kind.trim() {
                "roots" | "root" => self.roots.push(absolute(kind, value)?),
                "sockets" | "socket" => self.sockets.push(absolute(kind, value)?),
                "remotes" | "remote" => self.remotes.push(value.to_string()),
                other => {
                    return Err(format!(
                        "--allow-create {other}=...: unknown kind (roots, sockets or remotes)"
                    ))
                }
            }
        }
        Ok(())
    }

    /// The same with every directory canonicalized (each must exist and be a directory).
    pub fn canonicalized(&self) -> Result<AllowCreate, String> {
        let canon = |kind: &str, dirs: &[PathBuf]| {
            dirs.iter()
                .map(|d| {
                    let c = d
                        .canonicalize()
                        .map_err(|e| format!("--allow-create {kind}={}: {e}", d.display()))?;
                    if !c.is_dir() {
                        return Err(format!("--allow-create {kind}={}: not a directory", d.display()));
                    }
                    Ok(c)
                })
                .collect::<Result<Vec<_>, String>>()
        };
        Ok(AllowCreate {
            roots: canon("roots", &self.roots)?,
            sockets: canon("sockets", &self.sockets)?,
            remotes: self.remotes.clone(),
        })
    }

    /// Checks a function `create_function` described against what is allowed, and puts its
    /// paths in canonical form; `Err` says what is refused.
    pub fn check(&self, spec: &mut FunctionSpec) -> Result<(), String> {
        let Socket::SocketPath(path) = &spec.socket else {
            return Err("`socket_path` is required".into());
        };
        spec.socket = Socket::SocketPath(self.socket_path(path)?);
        match &mut spec.backend {
            BackendSpec::Ram { .. } => {}
            BackendSpec::SharedDir { shared_dir, .. } => *shared_dir = self.shared_dir(shared_dir)?,
            BackendSpec::Remote(r) => {
                // Every host of the URL (NFSv4.1 takes several addresses of one server).
                let url = &r.options.url;
                for host in std::iter::once(&url.host).chain(url.also.iter().map(|(h, _)| h)) {
                    if !self.remotes.iter().any(|h| h.eq_ignore_ascii_case(host)) {
                        return Err(format!(
                            "`remote` host {host:?} is not allowed (--allow-create remotes=HOST; allowed: {})",
                            list(&self.remotes)
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// `socket_path` as it will be bound: its directory canonical and allowed, its name not a
    /// symbolic link nor a file other than a socket.
    pub fn socket_path(&self, path: &Path) -> Result<PathBuf, String> {
        let shown = path.display();
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(format!("`socket_path` {shown}: not a file name in a directory"));
        };
        let dir = dir.canonicalize().map_err(|e| format!("`socket_path` {shown}: its directory: {e}"))?;
        if !self.sockets.contains(&dir) {
            return Err(format!(
                "`socket_path` {shown}: directory {} is not allowed (--allow-create sockets=DIR; allowed: {})",
                dir.display(),
                list(&self.sockets)
            ));
        }
        let full = dir.join(name);
        let mut lock = full.clone().into_os_string();
        lock.push(".lock");
        for (p, socket) in [(full.as_path(), true), (Path::new(&lock), false)] {
            match std::fs::symlink_metadata(p) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(format!("`socket_path` {shown}: {} is a symbolic link", p.display()))
                }
                Ok(m) if socket && !m.file_type().is_socket() => {
                    return Err(format!("`socket_path` {shown}: {} exists and is not a socket", p.display()))
                }
                Ok(m) if !socket && !m.file_type().is_file() => {
                    return Err(format!("`socket_path` {shown}: {} is not a regular file", p.display()))
                }
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(format!("`socket_path` {shown}: {}: {e}", p.display())),
            }
        }
        Ok(full)
    }

    /// `shared_dir` canonical, beneath an allowed root.
    fn shared_dir(&self, dir: &Path) -> Result<PathBuf, String> {
        let shown = dir.display();
        let c = dir.canonicalize().map_err(|e| format!("`shared_dir` {shown}: {e}"))?;
        if !self.roots.iter().any(|r| c.starts_with(r)) {
            return Err(format!(
                "`shared_dir` {shown} (that is {}) is not beneath an allowed root (--allow-create roots=DIR; allowed: {})",
                c.display(),
                list(&self.roots)
            ));
        }
        Ok(c)
    }
}

fn absolute(kind: &str, value: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(value);
    if !p.is_absolute() {
        return Err(format!("--allow-create {kind}={value}: must be an absolute path"));
    }
    Ok(p)
}

fn list<T: std::fmt::Debug>(items: &[T]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.iter().map(|i| format!("{i:?}")).collect::<Vec<_>>().join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_reads_kinds_and_refuses_the_rest() {
        let mut a = AllowCreate::default();
        a.add("roots=/srv/shares,sockets=/run/vfdpu").unwrap();
        a.add("remotes=10.0.0.5").unwrap();
        assert_eq!(a.roots, [PathBuf::from("/srv/shares")]);
        assert_eq!(a.sockets, [PathBuf::from("/run/vfdpu")]);
        assert_eq!(a.remotes, ["10.0.0.5"]);
        for bad in ["roots", "roots=", "root=rel", "hosts=x", "sockets=./s"] {
            assert!(a.add(bad).is_err(), "{bad}");
        }
        assert!(AllowCreate { roots: vec!["/no/such/dir".into()], ..Default::default() }
            .canonicalized()
            .is_err());
    }
}
