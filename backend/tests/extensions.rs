//! Request extensions on the RAM filesystem: the supplementary group of `FUSE_EXT_GROUPS`
//! (`FUSE_CREATE_SUPP_GROUP`) counts in the permission check of a creation, malformed extensions
//! are EINVAL with nothing done, and security contexts and unknown types are skipped.

mod harness;

use harness::ram::Fuse;
use harness::*;
use virtiofs_backend::abi::{self, opcode};
use vm_memory::ByteValued;

const S_IFREG: u32 = libc::S_IFREG;
const S_IFIFO: u32 = libc::S_IFIFO;
const ALICE: (u32, u32) = (1000, 1000);
const TEAM: u32 = 4242;

/// Root makes `/team` (group TEAM, 0775: only the group may create in it) and `/sgid`
/// (the same, set-group-id).
fn setup() -> (Fuse, u64, u64) {
    let f = Fuse::new();
    let team = f.mkdir(ROOT, b"team", 0o775).unwrap().nodeid;
    f.chown(team, None, Some(TEAM)).unwrap();
    let sgid = f.mkdir(ROOT, b"sgid", 0o775).unwrap().nodeid;
    f.chown(sgid, None, Some(TEAM)).unwrap();
    f.chmod(sgid, 0o2775).unwrap();
    f.as_user(ALICE.0, ALICE.1);
    (f, team, sgid)
}

fn mkdir_ext(f: &Fuse, parent: u64, name: &[u8], ext: &[u8]) -> Reply {
    let arg = abi::MkdirIn { mode: 0o755, umask: 0 };
    f.call_ext(opcode::MKDIR, parent, &[arg.as_slice(), &cstr(name)], ext, (ext.len() / 8) as u16)
}

#[test]
fn creations_count_the_supplementary_group_of_the_parent() {
    let (f, team, sgid) = setup();
    let g = groups_ext(&[TEAM]);
    assert_eq!(g.len(), 16, "the kernel's size: header, count, one group");
    // Without the extension Alice is "other" on /team: no write.
    assert_eq!(f.mkdir(team, b"d", 0o755).unwrap_err(), libc::EACCES);
    assert_eq!(f.mknod(team, b"n", S_IFREG | 0o644, 0).unwrap_err(), libc::EACCES);
    // With it, every creation the kernel sends it with.
    let d: abi::EntryOut = parse(&mkdir_ext(&f, team, b"d", &g).result().unwrap());
    assert_eq!((d.attr.uid, d.attr.gid), ALICE, "the new node's group is the caller's fsgid");
    let mknod = abi::MknodIn { mode: S_IFIFO | 0o644, rdev: 0, umask: 0, padding: 0 };
    let n = f.call_ext(opcode::MKNOD, team, &[mknod.as_slice(), &cstr(b"fifo")], &g, 2).result().unwrap();
    assert_eq!(parse::<abi::EntryOut>(&n).attr.gid, ALICE.1);
    let sym = f.call_ext(opcode::SYMLINK, team, &[&cstr(b"link"), &cstr(b"target")], &g, 2);
    assert_eq!(sym.errno(), 0);
    let create = abi::CreateIn { flags: O_RDWR, mode: 0o644, umask: 0, open_flags: 0 };
    let c = f.call_ext(opcode::CREATE, team, &[create.as_slice(), &cstr(b"file")], &g, 2);
    assert_eq!(c.errno(), 0);
    let t = f.call_ext(opcode::TMPFILE, team, &[create.as_slice(), b"/\0"], &g, 2);
    assert_eq!(t.errno(), 0);
    // In a set-group-id directory the node takes the directory's group (a directory the bit too).
    let sd: abi::EntryOut = parse(&mkdir_ext(&f, sgid, b"d", &g).result().unwrap());
    assert_eq!(sd.attr.gid, TEAM);
    assert_ne!(sd.attr.mode & libc::S_ISGID, 0);
    // Another group, or an empty list, grants nothing.
    assert_eq!(mkdir_ext(&f, team, b"x", &groups_ext(&[5555])).errno(), libc::EACCES);
    assert_eq!(mkdir_ext(&f, team, b"y", &groups_ext(&[])).errno(), libc::EACCES);
    assert_eq!(f.lookup(team, b"x").unwrap_err(), libc::ENOENT);
    // The group lasts for its request only.
    assert_eq!(f.mkdir(team, b"z", 0o755).unwrap_err(), libc::EACCES);
}

#[test]
fn malformed_extensions_are_einval_and_do_nothing() {
    let (f, team, _) = setup();
    let ext = |size: u32, typ: u32, body: &[u8]| {
        let mut v = abi::ExtHeader { size, typ }.as_slice().to_vec();
        v.extend_from_slice(body);
        v
    };
    let one = [1u32.to_ne_bytes(), TEAM.to_ne_bytes()].concat();
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("size 0", ext(0, abi::ext::GROUPS, &one), 2),
        ("size below the header", ext(4, abi::ext::GROUPS, &one), 2),
        ("size not a multiple of 8", ext(12, abi::ext::GROUPS, &one), 2),
        ("size past the end", ext(24, abi::ext::GROUPS, &one), 2),
        ("security context of size 0", ext(0, 1, &[]), 1),
        ("no group count", ext(8, abi::ext::GROUPS, &[]), 1),
        (
            "count past the end",
            ext(16, abi::ext::GROUPS, &[2u32.to_ne_bytes(), TEAM.to_ne_bytes()].concat()),
            2,
        ),
        ("two group lists", [groups_ext(&[TEAM]), groups_ext(&[TEAM])].concat(), 4),
        ("unknown type, bad size", ext(13, 77, &[0; 8]), 2),
    ];
    for (what, e, extlen) in cases {
        let arg = abi::MkdirIn { mode: 0o755, umask: 0 };
        let r = f.call_ext(opcode::MKDIR, team, &[arg.as_slice(), &cstr(b"d")], &e, extlen);
        assert_eq!(r.errno(), libc::EINVAL, "{what}");
    }
    // total_extlen beyond the request.
    let arg = abi::MkdirIn { mode: 0o755, umask: 0 };
    let r = f.call_ext(opcode::MKDIR, team, &[arg.as_slice(), &cstr(b"d")], &groups_ext(&[TEAM]), 200);
    assert_eq!(r.errno(), libc::EINVAL);
    // A request without a reply is dropped silently.
    let r = f.call_ext(opcode::FORGET, ROOT, &[&1u64.to_ne_bytes()], &ext(0, 32, &[]), 1);
    assert_eq!(r.n, 0);
    assert_eq!(f.as_user(0, 0).lookup(team, b"d").unwrap_err(), libc::ENOENT, "nothing was created");
}

#[test]
fn security_contexts_and_unknown_types_are_skipped() {
    let (f, team, _) = setup();
    // What FUSE_SECURITY_CTX adds (fuse_secctx_header: size, nr_secctx = 1; fuse_secctx; name;
    // context), then a type from a newer kernel, then the groups.
    let mut secctx = abi::ExtHeader { size: 40, typ: 1 }.as_slice().to_vec();
    secctx.extend_from_slice(&11u32.to_ne_bytes()); // fuse_secctx.size
    secctx.extend_from_slice(&0u32.to_ne_bytes()); // padding
    secctx.extend_from_slice(b"selinux\0ctx:x_t\0"); // name, context
    secctx.resize(40, 0);
    let newer =
        abi::ExtHeader { size: 16, typ: 33 }.as_slice().iter().copied().chain([0xee; 8]).collect::<Vec<_>>();
    let all = [secctx, newer, groups_ext(&[TEAM])].concat();
    let r = mkdir_ext(&f, team, b"d", &all);
    assert_eq!(r.errno(), 0, "skipped extensions do not hide the group");
    // On any request, the extension is cut off before the arguments are read.
    let g = groups_ext(&[TEAM]);
    let r = f.call_ext(opcode::GETATTR, team, &[&[0u8; 16]], &g, 2);
    assert_eq!(r.errno(), 0);
    assert_eq!(parse::<abi::AttrOut>(&r.body).attr.gid, TEAM);
}
