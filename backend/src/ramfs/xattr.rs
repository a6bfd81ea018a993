//! Extended attributes of [`RamFs`], with the namespaces and rules of Linux (`xattr_permission`,
//! `cap_inode_setxattr`, `set_posix_acl`):
//!
//! | namespace | read | write |
//! |---|---|---|
//! | `user.` | regular files and directories only (else `ENODATA`); read permission | regular files and directories only (else `EPERM`); in a sticky directory only its owner or root (`EPERM`); write permission |
//! | `trusted.` | root only (else `ENODATA`, and hidden from LISTXATTR) | root only (`EPERM`) |
//! | `security.` | anyone | root only (`EPERM`) |
//! | `system.posix_acl_access` / `system.posix_acl_default` | anyone | owner or root (`EPERM`); default ACLs on directories only (`EACCES`) |
//!
//! Other names are `EOPNOTSUPP`. Names are 1..=255 bytes (`ERANGE`), values up to 64 KiB (`E2BIG`),
//! and one inode holds at most [`XATTR_INODE_MAX`] bytes of names and values; every byte is charged
//! to the filesystem's capacity. The ACLs are kept parsed in the inode's attributes (see
//! [`super::acl`]); setting an access ACL sets the mode's permission bits, and an ACL the mode can
//! express is stored as the mode alone.

use std::sync::Arc;

use super::acl::{self, AclEntry};
use super::consts::{R_OK, S_IFDIR, S_IFLNK, S_IFREG, S_ISGID, S_ISVTX, W_OK};
use super::node::{Inode, Meta};
use super::{RamFs, XATTR_INODE_MAX};
use crate::abi::limits::{XATTR_NAME_MAX, XATTR_SIZE_MAX};
use crate::filesystem::{Context, Error, Result, XattrReply};

/// Longest LISTXATTR answer the kernel can take (`XATTR_LIST_MAX`).
const XATTR_LIST_MAX: usize = 64 << 10;
const XATTR_CREATE: u32 = libc::XATTR_CREATE as u32;
const XATTR_REPLACE: u32 = libc::XATTR_REPLACE as u32;
const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";
const CAPS: &[u8] = b"security.capability";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ns {
    User,
    Trusted,
    Security,
    AclAccess,
    AclDefault,
}

fn namespace(name: &[u8]) -> Result<Ns> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX {
        return Err(Error::OutOfRange);
    }
    let (ns, rest) = if let Some(rest) = name.strip_prefix(b"user.") {
        (Ns::User, rest)
    } else if let Some(rest) = name.strip_prefix(b"trusted.") {
        (Ns::Trusted, rest)
    } else if let Some(rest) = name.strip_prefix(b"security.") {
        (Ns::Security, rest)
    } else if name == ACL_ACCESS {
        return Ok(Ns::AclAccess);
    } else if name == ACL_DEFAULT {
        return Ok(Ns::AclDefault);
    } else {
        return Err(Error::NotSupported);
    };
    if rest.is_empty() {
        return Err(Error::InvalidArgument);
    }
    Ok(ns)
}

fn user_ok(kind: u32) -> bool {
    kind == S_IFREG || kind == S_IFDIR
}

/// May `ctx` read attributes of namespace `ns` (not an ACL) of an inode of type `kind`?
fn check_read(ctx: &Context, kind: u32, m: &Meta, ns: Ns) -> Result<()> {
    match ns {
        Ns::User if !user_ok(kind) => Err(Error::NoData),
        Ns::User if !m.may(ctx, R_OK) => Err(Error::AccessDenied),
        Ns::Trusted if ctx.uid != 0 => Err(Error::NoData),
        _ => Ok(()),
    }
}

/// May `ctx` set or remove attributes of namespace `ns` (not an ACL)?
fn check_write(ctx: &Context, kind: u32, m: &Meta, ns: Ns) -> Result<()> {
    match ns {
        Ns::User if !user_ok(kind) => Err(Error::NotPermitted),
        Ns::User if kind == S_IFDIR && m.mode & S_ISVTX != 0 && !m.owner_or_root(ctx) => {
            Err(Error::NotPermitted)
        }
        Ns::User if !m.may(ctx, W_OK) => Err(Error::AccessDenied),
        Ns::Trusted | Ns::Security if ctx.uid != 0 => Err(Error::NotPermitted),
        _ => Ok(()),
    }
}

/// The GETXATTR/LISTXATTR answer for `value` and a caller buffer of `size` bytes.
fn sized(value: &[u8], size: u32) -> Result<XattrReply> {
    let len = u32::try_from(value.len()).map_err(|_| Error::TooBig)?;
    match size {
        0 => Ok(XattrReply::Size(len)),
        s if len > s => Err(Error::OutOfRange),
        _ => Ok(XattrReply::Data(value.to_vec())),
    }
}

impl RamFs {
    /// Moves the bytes `m` charges for its attributes from `old` to `new` (per inode and against
    /// the capacity); all or nothing.
    fn recharge(&self, m: &mut Meta, old: usize, new: usize) -> Result<()> {
        let total = m.xattr_bytes.saturating_sub(old as u64) + new as u64;
        if total > XATTR_INODE_MAX {
            return Err(Error::NoSpace);
        }
        if new > old {
            self.charge((new - old) as u64)?;
        } else {
            self.uncharge((old - new) as u64);
        }
        m.xattr_bytes = total;
        Ok(())
    }

    /// Removes `security.capability` (a write, truncate or chown happened); the caller holds `m`.
    pub(super) fn drop_fcaps(&self, inode: &Inode, m: &mut Meta) {
        let mut x = inode.xattrs_mut();
        if let Some(v) = x.map.remove(CAPS) {
            x.list_len -= CAPS.len() + 1;
            let _ = self.recharge(m, CAPS.len() + v.len(), 0);
        }
        m.fcaps = false;
    }

    pub(super) fn set_xattr(
        &self,
        ctx: &Context,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: u32,
        acl_kill_sgid: Option<bool>,
    ) -> Result<()> {
        let ns = namespace(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(Error::TooBig);
        }
        if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
            return Err(Error::InvalidArgument);
        }
        let inode = self.inode(ino)?;
        match ns {
            Ns::AclAccess | Ns::AclDefault => {
                return self.set_acl(ctx, &inode, ns == Ns::AclDefault, acl::decode(value)?, acl_kill_sgid)
            }
            Ns::User | Ns::Trusted | Ns::Security => {}
        }
        let mut m = inode.meta_mut();
        check_write(ctx, inode.kind, &m, ns)?;
        let mut x = inode.xattrs_mut();
        let old = x.map.get(name).map(|v| name.len() + v.len());
        match old {
            Some(_) if flags & XATTR_CREATE != 0 => return Err(Error::Exists),
            None if flags & XATTR_REPLACE != 0 => return Err(Error::NoData),
            // Room in the LISTXATTR answer for a new name (and for both ACL names).
            None if x.list_len + name.len() + 1 + ACL_ACCESS.len() + ACL_DEFAULT.len() + 2
                > XATTR_LIST_MAX =>
            {
                return Err(Error::NoSpace)
            }
            _ => {}
        }
        self.recharge(&mut m, old.unwrap_or(0), name.len() + value.len())?;
        if x.map.insert(name.into(), value.into()).is_none() {
            x.list_len += name.len() + 1;
        }
        if name == CAPS {
            m.fcaps = true;
        }
        m.ctime = super::node::now();
        Ok(())
    }

    pub(super) fn get_xattr(&self, ctx: &Context, ino: u64, name: &[u8], size: u32) -> Result<XattrReply> {
        let ns = namespace(name)?;
        let inode = self.inode(ino)?;
        let m = inode.meta_ref();
        match ns {
            // Symbolic links have no ACLs: EOPNOTSUPP, as Linux's `do_get_acl`.
            Ns::AclAccess | Ns::AclDefault if inode.kind == S_IFLNK => Err(Error::NotSupported),
            Ns::AclAccess => {
                let acl = m.acl.as_ref().ok_or(Error::NoData)?;
                sized(&acl::encode(acl.entries(m.mode)), size)
            }
            Ns::AclDefault => {
                let dacl = m.default_acl.as_ref().ok_or(Error::NoData)?;
                sized(&acl::encode(dacl.iter().copied()), size)
            }
            Ns::User | Ns::Trusted | Ns::Security => {
                check_read(ctx, inode.kind, &m, ns)?;
                let x = inode.xattrs_ref();
                sized(x.map.get(name).ok_or(Error::NoData)?, size)
            }
        }
    }

    pub(super) fn list_xattr(&self, ctx: &Context, ino: u64, size: u32) -> Result<XattrReply> {
        let inode = self.inode(ino)?;
        let m = inode.meta_ref();
        let x = inode.xattrs_ref();
        let acls = [(m.acl.is_some(), ACL_ACCESS), (m.default_acl.is_some(), ACL_DEFAULT)];
        let names = || {
            acls.iter()
                .filter(|(present, _)| *present)
                .map(|(_, name)| *name)
                .chain(x.map.keys().map(|k| &k[..]))
                .filter(|k| ctx.uid == 0 || !k.starts_with(b"trusted."))
        };
        let len = names().map(|n| n.len() + 1).sum::<usize>();
        let len32 = u32::try_from(len).map_err(|_| Error::TooBig)?;
        if size == 0 {
            return Ok(XattrReply::Size(len32));
        }
        if len32 > size {
            return Err(Error::OutOfRange);
        }
        let mut list = Vec::with_capacity(len);
        for n in names() {
            list.extend_from_slice(n);
            list.push(0);
        }
        Ok(XattrReply::Data(list))
    }

    pub(super) fn remove_xattr(&self, ctx: &Context, ino: u64, name: &[u8]) -> Result<()> {
        let ns = namespace(name)?;
        let inode = self.inode(ino)?;
        match ns {
            Ns::AclAccess | Ns::AclDefault => {
                return self.set_acl(ctx, &inode, ns == Ns::AclDefault, None, None)
            }
            Ns::User | Ns::Trusted | Ns::Security => {}
        }
        let mut m = inode.meta_mut();
        check_write(ctx, inode.kind, &m, ns)?;
        let mut x = inode.xattrs_mut();
        let v = x.map.remove(name).ok_or(Error::NoData)?;
        x.list_len -= name.len() + 1;
        self.recharge(&mut m, name.len() + v.len(), 0)?;
        if name == CAPS {
            m.fcaps = false;
        }
        m.ctime = super::node::now();
        Ok(())
    }

    /// Sets (or, with `None`, removes) the access or default ACL of `inode`, as `set_posix_acl`
    /// and `posix_acl_update_mode` do. Removing an absent ACL succeeds.
    fn set_acl(
        &self,
        ctx: &Context,
        inode: &Inode,
        default: bool,
        entries: Option<Vec<AclEntry>>,
        acl_kill_sgid: Option<bool>,
    ) -> Result<()> {
        if inode.kind == S_IFLNK {
            return Err(Error::NotSupported);
        }
        let mut m = inode.meta_mut();
        if default && inode.kind != S_IFDIR {
            return if entries.is_some() { Err(Error::AccessDenied) } else { Ok(()) };
        }
        if !m.owner_or_root(ctx) {
            return Err(Error::NotPermitted);
        }
        if let Some(e) = &entries {
            acl::validate(e)?;
        }
        let setting = entries.is_some();
        let had = if default { m.default_acl.is_some() } else { m.acl.is_some() };
        if default {
            let old = m.default_acl.as_ref().map_or(0, |d| acl::value_size(d.len()));
            let new = entries.as_ref().map_or(0, |e| acl::value_size(e.len()));
            self.recharge(&mut m, old, new)?;
            m.default_acl = entries.map(Into::into);
        } else {
            let old = m.acl.as_ref().map_or(0, |a| a.value_size());
            match entries {
                // The mode keeps the bits it has (its group bits were the mask).
                None => {
                    self.recharge(&mut m, old, 0)?;
                    m.acl = None;
                }
                Some(e) => {
                    let (perm, ext) = acl::split_access(&e);
                    self.recharge(&mut m, old, ext.as_ref().map_or(0, |a| a.value_size()))?;
                    m.mode = (m.mode & !0o777) | perm;
                    let in_group = ctx.uid == 0 || ctx.in_group(m.gid);
                    if acl_kill_sgid.unwrap_or(!in_group) {
                        m.mode &= !S_ISGID;
                    }
                    m.acl = ext.map(Arc::new);
                }
            }
        }
        if had || setting {
            m.ctime = super::node::now();
        }
        Ok(())
    }
}
