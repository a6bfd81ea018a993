//! POSIX access control lists, as Linux keeps them (`fs/posix_acl.c`): the
//! `system.posix_acl_access` / `system.posix_acl_default` value format, validation, the permission
//! algorithm and inheritance by new nodes.
//!
//! An access ACL is stored split, the way the kernel presents it: the owner, mask (or group when
//! there is no mask) and other entries *are* the mode's permission bits, so only the rest is kept
//! ([`ExtAcl`]: the owning group's entry and the named users and groups). An ACL equivalent to the
//! mode is not stored at all. `chmod` therefore updates the ACL by itself, as `posix_acl_chmod`
//! does. A default ACL (directories only) is kept whole.

use crate::filesystem::{Context, Error, Result};

pub(super) const ACL_USER_OBJ: u16 = 0x01;
pub(super) const ACL_USER: u16 = 0x02;
pub(super) const ACL_GROUP_OBJ: u16 = 0x04;
pub(super) const ACL_GROUP: u16 = 0x08;
pub(super) const ACL_MASK: u16 = 0x10;
pub(super) const ACL_OTHER: u16 = 0x20;

/// `POSIX_ACL_XATTR_VERSION`.
const VERSION: u32 = 2;
/// `ACL_UNDEFINED_ID`: the id field of entries that have none.
const UNDEFINED_ID: u32 = u32::MAX;
const HEADER: usize = 4;
const ENTRY: usize = 8;
/// Largest ACL value: the kernel refuses to send a bigger one (`fuse_set_acl`, `E2BIG`) and reads
/// them back into one page.
pub(super) const ACL_MAX_BYTES: usize = 4096;

/// One ACL entry; `perm` is `rwx` as 4/2/1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AclEntry {
    pub(super) tag: u16,
    pub(super) perm: u16,
    pub(super) id: u32,
}

/// Parses an ACL value. `Ok(None)` is the empty ACL (header only), which removes the ACL, as
/// `posix_acl_from_xattr` returns no ACL for it. Only the format is checked here; see [`validate`].
pub(super) fn decode(value: &[u8]) -> Result<Option<Vec<AclEntry>>> {
    if value.len() > ACL_MAX_BYTES {
        return Err(Error::TooBig);
    }
    let (Some(header), Some(body)) = (value.get(..HEADER), value.get(HEADER..)) else {
        return Err(Error::InvalidArgument);
    };
    if u32::from_le_bytes([header[0], header[1], header[2], header[3]]) != VERSION {
        return Err(Error::NotSupported);
    }
    if body.len() % ENTRY != 0 {
        return Err(Error::InvalidArgument);
    }
    if body.is_empty() {
        return Ok(None);
    }
    let entries = body
        .chunks_exact(ENTRY)
        .map(|e| {
            let tag = u16::from_le_bytes([e[0], e[1]]);
            let perm = u16::from_le_bytes([e[2], e[3]]);
            let id = match tag {
                ACL_USER | ACL_GROUP => u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
                _ => UNDEFINED_ID,
            };
            AclEntry { tag, perm, id }
        })
        .collect();
    Ok(Some(entries))
}

/// `posix_acl_valid`: known tags in canonical order (owner, named users, owning group, named
/// groups, mask, other), exactly one owner, owning group and other, a mask when there are named
/// entries, `rwx` permissions only, and real ids on named entries.
pub(super) fn validate(entries: &[AclEntry]) -> Result<()> {
    #[derive(PartialEq)]
    enum State {
        UserObj,
        User,
        Group,
        Other,
        Done,
    }
    let mut state = State::UserObj;
    let mut needs_mask = false;
    for e in entries {
        if e.perm & !7 != 0 {
            return Err(Error::InvalidArgument);
        }
        state = match (e.tag, state) {
            (ACL_USER_OBJ, State::UserObj) => State::User,
            (ACL_USER, State::User) if e.id != UNDEFINED_ID => {
                needs_mask = true;
                State::User
            }
            (ACL_GROUP_OBJ, State::User) => State::Group,
            (ACL_GROUP, State::Group) if e.id != UNDEFINED_ID => {
                needs_mask = true;
                State::Group
            }
            (ACL_MASK, State::Group) => State::Other,
            (ACL_OTHER, State::Other) => State::Done,
            (ACL_OTHER, State::Group) if !needs_mask => State::Done,
            _ => return Err(Error::InvalidArgument),
        };
    }
    if state == State::Done {
        Ok(())
    } else {
        Err(Error::InvalidArgument)
    }
}

/// Serialises `entries` as an ACL value.
pub(super) fn encode(entries: impl Iterator<Item = AclEntry>) -> Vec<u8> {
    let mut v = VERSION.to_le_bytes().to_vec();
    for e in entries {
        v.extend_from_slice(&e.tag.to_le_bytes());
        v.extend_from_slice(&e.perm.to_le_bytes());
        v.extend_from_slice(&e.id.to_le_bytes());
    }
    v
}

/// Size of the value of an ACL with `n` entries.
pub(super) fn value_size(n: usize) -> usize {
    HEADER + n * ENTRY
}

/// What an access ACL holds beyond the mode bits: the owning group's permissions (the mode's
/// group bits are the mask) and the named users and groups, in order. Its existence means the ACL
/// has a mask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ExtAcl {
    pub(super) group_obj: u16,
    pub(super) named: Box<[AclEntry]>,
}

impl ExtAcl {
    /// The whole ACL, with owner, mask and other taken from `mode`.
    pub(super) fn entries(&self, mode: u32) -> impl Iterator<Item = AclEntry> + '_ {
        let obj = |tag, bits: u32| AclEntry { tag, perm: (bits & 7) as u16, id: UNDEFINED_ID };
        let users = self.named.iter().copied().filter(|e| e.tag == ACL_USER);
        let groups = self.named.iter().copied().filter(|e| e.tag == ACL_GROUP);
        std::iter::once(obj(ACL_USER_OBJ, mode >> 6))
            .chain(users)
            .chain(std::iter::once(obj(ACL_GROUP_OBJ, u32::from(self.group_obj))))
            .chain(groups)
            .chain([obj(ACL_MASK, mode >> 3), obj(ACL_OTHER, mode)])
    }

    /// Bytes of its value.
    pub(super) fn value_size(&self) -> usize {
        value_size(self.named.len() + 4)
    }

    /// `posix_acl_permission` for a caller who is not the owner: the first named user matching,
    /// else the owning group and named groups (any one granting `want`), each limited by the mask;
    /// when a group matched but none grants, no access; else the other bits. Group membership is
    /// what the request tells ([`Context::in_group`]).
    pub(super) fn permits(&self, ctx: &Context, file_gid: u32, mode: u32, want: u32) -> bool {
        let mask = (mode >> 3) & 7;
        let grants = |perm: u16| u32::from(perm) & want == want;
        let masked = |perm: u16| u32::from(perm) & mask & want == want;
        if let Some(e) = self.named.iter().find(|e| e.tag == ACL_USER && e.id == ctx.uid) {
            return masked(e.perm);
        }
        let mut found = false;
        if ctx.in_group(file_gid) {
            found = true;
            if grants(self.group_obj) {
                return masked(self.group_obj);
            }
        }
        for e in self.named.iter().filter(|e| e.tag == ACL_GROUP && ctx.in_group(e.id)) {
            found = true;
            if grants(e.perm) {
                return masked(e.perm);
            }
        }
        !found && mode & 7 & want == want
    }
}

/// `posix_acl_equiv_mode` on a valid access ACL: the permission bits it implies, and what must be
/// kept besides them (`None` when the mode says it all: no mask and no named entries).
pub(super) fn split_access(entries: &[AclEntry]) -> (u32, Option<ExtAcl>) {
    let (mut user, mut group_obj, mut mask, mut other) = (0, 0, None, 0);
    let mut named = Vec::new();
    for e in entries {
        match e.tag {
            ACL_USER_OBJ => user = e.perm,
            ACL_GROUP_OBJ => group_obj = e.perm,
            ACL_MASK => mask = Some(e.perm),
            ACL_OTHER => other = e.perm,
            _ => named.push(*e),
        }
    }
    let perm = u32::from(user) << 6 | u32::from(mask.unwrap_or(group_obj)) << 3 | u32::from(other);
    let ext = mask.map(|_| ExtAcl { group_obj, named: named.into_boxed_slice() });
    (perm, ext)
}

/// `posix_acl_create_masq`: a new node's access ACL from its parent's default ACL and the mode it
/// is created with (no umask). Returns the new mode (special bits kept) and the ACL beyond it.
pub(super) fn inherit(default: &[AclEntry], mode: u32) -> (u32, Option<ExtAcl>) {
    let mut acl = default.to_vec();
    let mut perm = mode & 0o777;
    let mut group_at = None;
    let mut mask_at = None;
    for (i, e) in acl.iter_mut().enumerate() {
        let p = u32::from(e.perm);
        match e.tag {
            ACL_USER_OBJ => {
                let v = p & (perm >> 6);
                e.perm = v as u16;
                perm = (perm & !0o700) | v << 6;
            }
            ACL_OTHER => {
                let v = p & perm & 7;
                e.perm = v as u16;
                perm = (perm & !0o007) | v;
            }
            ACL_GROUP_OBJ => group_at = Some(i),
            ACL_MASK => mask_at = Some(i),
            _ => {}
        }
    }
    if let Some(i) = mask_at.or(group_at) {
        let v = u32::from(acl[i].perm) & (perm >> 3) & 7;
        acl[i].perm = v as u16;
        perm = (perm & !0o070) | v << 3;
    }
    let (_, ext) = split_access(&acl);
    ((mode & !0o777) | perm, ext)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(tag: u16, perm: u16, id: u32) -> AclEntry {
        AclEntry { tag, perm, id }
    }

    fn minimal(u: u16, g: u16, o: u16) -> Vec<AclEntry> {
        vec![
            e(ACL_USER_OBJ, u, UNDEFINED_ID),
            e(ACL_GROUP_OBJ, g, UNDEFINED_ID),
            e(ACL_OTHER, o, UNDEFINED_ID),
        ]
    }

    #[test]
    fn validation_follows_the_kernel() {
        assert!(validate(&minimal(7, 5, 0)).is_ok());
        let named = |tag| {
            vec![
                e(ACL_USER_OBJ, 7, 0),
                e(tag, 6, 1000),
                e(ACL_GROUP_OBJ, 5, 0),
                e(ACL_MASK, 7, 0),
                e(ACL_OTHER, 0, 0),
            ]
        };
        assert!(validate(&named(ACL_USER)).is_ok());
        assert_eq!(validate(&named(ACL_GROUP)), Err(Error::InvalidArgument), "group before owning group");
        let mut no_mask = named(ACL_USER);
        no_mask.remove(3);
        assert_eq!(validate(&no_mask), Err(Error::InvalidArgument), "named entries need a mask");
        let mut bad_perm = minimal(7, 5, 0);
        bad_perm[1].perm = 8;
        assert_eq!(validate(&bad_perm), Err(Error::InvalidArgument));
        let mut bad_id = named(ACL_USER);
        bad_id[1].id = UNDEFINED_ID;
        assert_eq!(validate(&bad_id), Err(Error::InvalidArgument));
        assert_eq!(validate(&minimal(7, 5, 0)[..2]), Err(Error::InvalidArgument), "no other");
        let dup = [minimal(7, 5, 0), minimal(7, 5, 0)].concat();
        assert_eq!(validate(&dup), Err(Error::InvalidArgument));
        assert_eq!(validate(&[e(0x40, 7, 0)]), Err(Error::InvalidArgument), "unknown tag");
    }

    #[test]
    fn decode_checks_the_format() {
        assert_eq!(decode(&[2, 0, 0]), Err(Error::InvalidArgument));
        assert_eq!(decode(&[1, 0, 0, 0]), Err(Error::NotSupported));
        assert_eq!(decode(&[2, 0, 0, 0]), Ok(None));
        assert_eq!(decode(&[2, 0, 0, 0, 1, 0, 7, 0]), Err(Error::InvalidArgument));
        let v = encode(minimal(6, 4, 4).into_iter());
        assert_eq!(decode(&v), Ok(Some(minimal(6, 4, 4))));
        assert_eq!(decode(&vec![0u8; ACL_MAX_BYTES + 4]), Err(Error::TooBig));
    }

    #[test]
    fn mode_equivalence_and_permission() {
        assert_eq!(split_access(&minimal(6, 4, 0)), (0o640, None));
        let acl = vec![
            e(ACL_USER_OBJ, 7, UNDEFINED_ID),
            e(ACL_USER, 6, 1000),
            e(ACL_GROUP_OBJ, 5, UNDEFINED_ID),
            e(ACL_GROUP, 2, 3000),
            e(ACL_MASK, 6, UNDEFINED_ID),
            e(ACL_OTHER, 1, UNDEFINED_ID),
        ];
        let (perm, ext) = split_access(&acl);
        assert_eq!(perm, 0o761);
        let ext = ext.unwrap();
        assert_eq!(ext.entries(perm).collect::<Vec<_>>(), acl, "read back as written");
        let ctx = |uid, gid| Context { uid, gid, pid: 0, supp_gid: None };
        // Named user: rw- under mask rw-.
        assert!(ext.permits(&ctx(1000, 1), 500, perm, 6));
        assert!(!ext.permits(&ctx(1000, 1), 500, perm, 1));
        // Owning group r-x, limited by the mask rw-: read yes, execute no (and no fallback to other).
        assert!(ext.permits(&ctx(1, 500), 500, perm, 4));
        assert!(!ext.permits(&ctx(1, 500), 500, perm, 1));
        // Named group -w-.
        assert!(ext.permits(&ctx(1, 3000), 500, perm, 2));
        assert!(!ext.permits(&ctx(1, 3000), 500, perm, 4));
        // Others: --x.
        assert!(ext.permits(&ctx(1, 1), 500, perm, 1));
        assert!(!ext.permits(&ctx(1, 1), 500, perm, 4));
        // A mask with no named entries still needs keeping.
        let with_mask = vec![
            e(ACL_USER_OBJ, 7, UNDEFINED_ID),
            e(ACL_GROUP_OBJ, 7, UNDEFINED_ID),
            e(ACL_MASK, 5, UNDEFINED_ID),
            e(ACL_OTHER, 0, UNDEFINED_ID),
        ];
        let (perm, ext) = split_access(&with_mask);
        assert_eq!(perm, 0o750);
        assert_eq!(ext.unwrap().group_obj, 7);
    }

    #[test]
    fn inheritance_masks_the_mode() {
        // Default u::rwx g::r-x o::---: a file created 0666 gets rw-r-----.
        let (mode, ext) = inherit(&minimal(7, 5, 0), libc::S_IFREG | 0o666);
        assert_eq!((mode, ext), (libc::S_IFREG | 0o640, None));
        // With a named user and a mask: the mask takes the group bits.
        let dacl = vec![
            e(ACL_USER_OBJ, 7, 0),
            e(ACL_USER, 7, 1000),
            e(ACL_GROUP_OBJ, 5, 0),
            e(ACL_MASK, 7, 0),
            e(ACL_OTHER, 5, 0),
        ];
        let (mode, ext) = inherit(&dacl, libc::S_IFDIR | libc::S_ISGID | 0o750);
        assert_eq!(mode, libc::S_IFDIR | libc::S_ISGID | 0o750);
        let ext = ext.unwrap();
        assert_eq!(ext.group_obj, 5);
        assert_eq!(&ext.named[..], &[e(ACL_USER, 7, 1000)]);
    }
}
