//! Issue 22: a RAM filesystem copied while it serves (`RamFs::precopy`), then only what
//! changed since (`RamFs::changes`, at the quiet point), is rebuilt by its successor
//! (`Restoring::new` on the copy, `Restoring::finish` with the changes) as exactly the
//! filesystem it is at the quiet point: same inodes, attributes, extended attributes, names and
//! READDIR cookies, chunks, handles and free slots. Changes that contradict the copy are
//! refused.

mod harness;

use harness::ram::Fuse;
use harness::*;
use serde::de::DeserializeOwned;
use serde::Serialize;
use virtiofs_backend::ramfs::state::{BodyState, RamFsChanges, RamFsState, Restoring};
use virtiofs_backend::ramfs::RamFsConfig;
use virtiofs_backend::RamFs;

/// Through JSON, as the state travels.
fn wire<T: Serialize + DeserializeOwned>(t: &T) -> T {
    serde_json::from_str(&serde_json::to_string(t).unwrap()).unwrap()
}

fn memfd(f: &Fuse) -> std::fs::File {
    std::fs::File::from(f.fs().data_memfd().try_clone_to_owned().unwrap())
}

fn rebuilt(f: &Fuse, base: &RamFsState, changes: &RamFsChanges) -> Result<RamFs, String> {
    let r = Restoring::new(RamFsConfig::default(), base, memfd(f)).map_err(|e| e.to_string())?;
    r.finish(Some(changes)).map_err(|e| e.to_string())
}

fn data(seed: u32, len: usize) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_mul(seed) % 251) as u8).collect()
}

/// A filesystem with a little of everything: directories, files with data, a symlink, an
/// extended attribute, a hard link, an open handle.
fn filled() -> (Fuse, u64, u64, u64, u64) {
    let f = Fuse::new();
    let a = f.mkdir(ROOT, b"a", 0o755).unwrap().nodeid;
    let b = f.mkdir(ROOT, b"b", 0o755).unwrap().nodeid;
    let c = f.mkdir(a, b"c", 0o700).unwrap().nodeid;
    f.mkdir(c, b"empty", 0o700).unwrap();
    for n in 0..40 {
        let (e, fh) =
            f.create(b, format!("f{n}").as_bytes(), 0o644, libc::O_RDWR as u32).map(with_fh).unwrap();
        f.write(e.nodeid, fh, 0, &data(n + 1, 70_000)).unwrap();
        f.release(e.nodeid, fh).unwrap();
    }
    f.symlink(a, b"link", b"../b/f1").unwrap();
    let (x, xfh) = f.create(a, b"x", 0o600, libc::O_RDWR as u32).map(with_fh).unwrap();
    f.write(x.nodeid, xfh, 0, &data(7, 200_000)).unwrap();
    f.setxattr(x.nodeid, b"user.tag", b"one", 0).unwrap();
    let f2 = f.lookup(b, b"f2").unwrap().nodeid;
    f.link(f2, a, b"f2-too").unwrap();
    (f, a, b, x.nodeid, xfh)
}

/// A file made and written in `a`, another file of `x` written far out, `b/f3` truncated and
/// `b/f4` unlinked: the new file with its handle, and `b/f3`.
fn some_changes(f: &Fuse, a: u64, b: u64, (x, xfh): (u64, u64)) -> ((u64, u64), u64) {
    let (n1, fh1) = f.create(a, b"new1", 0o644, libc::O_RDWR as u32).map(with_fh).unwrap();
    f.write(n1.nodeid, fh1, 0, &data(3, 300_000)).unwrap();
    f.write(x, xfh, 1 << 20, b"far").unwrap();
    let f3 = f.lookup(b, b"f3").unwrap().nodeid;
    f.truncate(f3, 1000).unwrap();
    f.unlink(b, b"f4").unwrap();
    ((n1.nodeid, fh1), f3)
}

/// Every kind of change after the copy: files made, written, truncated, unlinked (one still
/// open), renamed (across directories, a directory, an exchange, over another file), a
/// directory removed and one made with a file in it, extended attributes set and removed,
/// modes and owners, handles opened and released, lookups and forgets, a hard link, an
/// `O_TMPFILE` file, and a file made and dropped inside the window.
#[test]
fn the_copy_and_the_changes_since_make_the_filesystem_as_it_is() {
    let (f, a, b, x, xfh) = filled();
    let base = wire(&f.fs().precopy());

    let ((n1, fh1), f3) = some_changes(&f, a, b, (x, xfh));
    let f5 = f.lookup(b, b"f5").unwrap().nodeid;
    let f5h = f.open(f5, libc::O_RDONLY as u32).unwrap();
    f.unlink(b, b"f5").unwrap();
    f.rename(b, b"f6", a, b"f6").unwrap();
    f.rename(a, b"c", b, b"c").unwrap();
    f.rename2(a, b"f6", b, b"f7", libc::RENAME_EXCHANGE).unwrap();
    f.rename(b, b"f8", b, b"f9").unwrap();
    let c = f.lookup(b, b"c").unwrap().nodeid;
    f.rmdir(c, b"empty").unwrap();
    let d2 = f.mkdir(a, b"d2", 0o750).unwrap().nodeid;
    let (inner, ih) = f.create(d2, b"inner", 0o600, libc::O_RDWR as u32).map(with_fh).unwrap();
    f.write(inner.nodeid, ih, 0, b"inner data").unwrap();
    f.setxattr(f3, b"user.new", b"two", 0).unwrap();
    f.removexattr(x, b"user.tag").unwrap();
    f.chmod(f3, 0o600).unwrap();
    f.chown(f3, Some(1000), Some(1000)).unwrap();
    f.release(x, xfh).unwrap();
    let f10 = f.lookup(b, b"f10").unwrap().nodeid;
    f.forget(f10, 1);
    for _ in 0..3 {
        f.lookup(b, b"f11").unwrap();
    }
    let f12 = f.lookup(b, b"f12").unwrap().nodeid;
    f.link(f12, d2, b"f12-link").unwrap();
    let (t, _tfh) = f.tmpfile(a, 0o600, libc::O_RDWR as u32, 0).map(with_fh).unwrap();
    f.write(t.nodeid, _tfh, 0, b"tmp").unwrap();
    let (gone, gh) = f.create(a, b"brief", 0o644, libc::O_RDWR as u32).map(with_fh).unwrap();
    f.write(gone.nodeid, gh, 0, &data(5, 100_000)).unwrap();
    f.release(gone.nodeid, gh).unwrap();
    f.unlink(a, b"brief").unwrap();
    f.forget(gone.nodeid, 1);
    let f13 = f.lookup(b, b"f13").unwrap().nodeid;
    f.forget(f13, 2);
    f.unlink(b, b"f13").unwrap();

    let changes = wire(&f.fs().changes().expect("a copy was taken"));
    assert!(f.fs().changes().is_none(), "marking stopped at the quiet point");
    let inodes = base.inodes.len();
    assert!(
        changes.inodes.len() + changes.gone.len() < inodes / 2,
        "the changes follow what changed: {} changed and {} gone of {inodes}",
        changes.inodes.len(),
        changes.gone.len()
    );
    assert!(changes.gone.contains(&gone.nodeid) && changes.gone.contains(&f13));
    let g = rebuilt(&f, &base, &changes).unwrap();
    assert_eq!(g.save(), f.fs().save(), "the rebuilt filesystem is the same");

    // It serves once committed: the data is the predecessor's (the memfd), new data takes
    // free slots only.
    let session = f.srv.save_session();
    g.take_data_back();
    let g = Fuse::with_fs(g);
    g.srv.restore_session(&session).unwrap();
    assert_eq!(g.read(n1, fh1, 0, 300_000).unwrap(), data(3, 300_000));
    assert_eq!(g.read(f5, f5h, 0, 70_000).unwrap(), data(6, 70_000), "the unlinked, open file");
    let (m, mh) = g.create(ROOT, b"after", 0o644, libc::O_RDWR as u32).map(with_fh).unwrap();
    g.write(m.nodeid, mh, 0, &data(9, 500_000)).unwrap();
    assert_eq!(g.read(n1, fh1, 0, 300_000).unwrap(), data(3, 300_000), "no slot in use reused");
    let f1 = g.lookup(b, b"f1").unwrap().nodeid;
    let h = g.open(f1, libc::O_RDONLY as u32).unwrap();
    assert_eq!(g.read(f1, h, 0, 70_000).unwrap(), data(2, 70_000));
}

/// The copy is taken while another thread keeps changing the filesystem (files made, written,
/// truncated, renamed, linked, unlinked and forgotten, so that slots change hands and names
/// come and go during the walk), many times over: each copy is accepted as it is, and with the
/// changes since it makes exactly the filesystem as it is.
#[test]
fn copies_taken_while_the_filesystem_changes_are_made_exact_by_the_changes() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let (f, a, b, _x, _xfh) = filled();
    // Enough inodes that a walk takes a while.
    let bulk = f.mkdir(ROOT, b"bulk", 0o755).unwrap().nodeid;
    for n in 0..4000 {
        let e = f.create(bulk, format!("b{n}").as_bytes(), 0o644, libc::O_RDWR as u32).map(with_fh).unwrap();
        f.release(e.0.nodeid, e.1).unwrap();
    }
    let m = f.mkdir(ROOT, b"moving", 0o755).unwrap().nodeid;
    for n in 0..300 {
        f.mkdir(m, format!("old{n}").as_bytes(), 0o755).unwrap();
    }
    let mut moving = (ROOT,);
    let mut total = 0u32;
    for round in 0..8u32 {
        let stop = Arc::new(AtomicBool::new(false));
        let srv = f.srv.clone();
        let s2 = stop.clone();
        let copier = std::thread::spawn(move || {
            // Wait for the changes to be under way, then copy while they go on.
            std::thread::sleep(std::time::Duration::from_millis(2));
            let copy = srv.filesystem().precopy();
            s2.store(true, Ordering::SeqCst);
            copy
        });
        let mut n = 0u32;
        while !stop.load(Ordering::SeqCst) || n < 50 {
            let k = round * 100_000 + n;
            let name = format!("c{k}");
            let (e, fh) = f.create(a, name.as_bytes(), 0o644, libc::O_RDWR as u32).map(with_fh).unwrap();
            f.write(e.nodeid, fh, 0, &data(k + 11, 1 + (k as usize * 7919) % 150_000)).unwrap();
            match k % 5 {
                0 => {
                    f.release(e.nodeid, fh).unwrap();
                    f.unlink(a, name.as_bytes()).unwrap();
                    f.forget(e.nodeid, 1);
                }
                1 => {
                    f.release(e.nodeid, fh).unwrap();
                    f.rename(a, name.as_bytes(), b, name.as_bytes()).unwrap();
                }
                2 => {
                    f.truncate(e.nodeid, 100).unwrap();
                    f.link(e.nodeid, b, format!("l{k}").as_bytes()).unwrap();
                    f.release(e.nodeid, fh).unwrap();
                }
                3 => {
                    // Unlinked while open: its data stays until the release, after the copy.
                    f.unlink(a, name.as_bytes()).unwrap();
                    // A directory of old entries moves into one made just now.
                    let to = f.mkdir(ROOT, format!("p{k}").as_bytes(), 0o755).unwrap().nodeid;
                    f.rename(moving.0, b"moving", to, b"moving").unwrap();
                    moving.0 = to;
                }
                _ => f.release(e.nodeid, fh).unwrap(),
            }
            n += 1;
        }
        let base = wire(&copier.join().unwrap());
        let changes = wire(&f.fs().changes().unwrap());
        let g = rebuilt(&f, &base, &changes).unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(g.save(), f.fs().save(), "round {round}, after {n} rounds of changes");
        total += n;
    }
    assert!(total >= 400, "{total}");
}

/// Changes that contradict the copy or themselves are refused; without a copy there are no
/// changes; a copy forgotten (the update called off) stops the marking.
#[test]
fn changes_that_contradict_the_copy_are_refused() {
    let (f, a, b, x, _xfh) = filled();
    assert!(f.fs().changes().is_none(), "no copy, no changes");
    f.fs().precopy();
    f.fs().forget_precopy();
    assert!(f.fs().changes().is_none(), "a forgotten copy");

    let base = f.fs().precopy();
    let (e, fh) = f.create(a, b"late", 0o644, libc::O_RDWR as u32).map(with_fh).unwrap();
    f.write(e.nodeid, fh, 0, &data(1, 100_000)).unwrap();
    f.chmod(x, 0o640).unwrap();
    let changes = f.fs().changes().unwrap();
    rebuilt(&f, &base, &changes).expect("the changes as they are");

    let f1 = base.dirs.iter().find(|d| d.ino == b).unwrap().entries.iter().find(|e| e.0 == b"f1").unwrap().2;
    let refused = |c: &RamFsChanges, why: &str| {
        let e = rebuilt(&f, &base, c).err().unwrap_or_else(|| panic!("accepted: {why}"));
        assert!(e.contains("state"), "{why}: {e}");
    };
    let mut bad = changes.clone();
    bad.version += 1;
    refused(&bad, "another version");
    let mut bad = changes.clone();
    bad.gone.push(f1);
    refused(&bad, "an inode gone while a directory still names it");
    let mut bad = changes.clone();
    bad.next_ino = base.next_ino - 1;
    refused(&bad, "the next inode number going back");
    let mut bad = changes.clone();
    let chmod = bad.inodes.iter_mut().find(|i| i.ino == x).unwrap();
    chmod.kind = libc::S_IFDIR;
    refused(&bad, "an inode changing its type");
    // The new file's chunks in a slot another file owns.
    let mut bad = changes.clone();
    let taken = base.inodes.iter().find_map(|i| match &i.body {
        BodyState::File(r) if !r.is_empty() => Some(r[0].1),
        _ => None,
    });
    let late = bad.inodes.iter_mut().find(|i| i.ino == e.nodeid).unwrap();
    late.body = BodyState::File(vec![(0, taken.unwrap(), 1)]);
    refused(&bad, "a slot owned twice");
    let mut bad = changes.clone();
    bad.names.push((a, b"ghost".to_vec(), Some((bad.next_ino, 999_999, 8))));
    refused(&bad, "an entry naming no inode");
    let mut bad = changes.clone();
    bad.handles.push((bad.next_fh + 5, Some((x, 0))));
    refused(&bad, "a handle past the next handle");
}

/// A successor dropped before the commit (an update called off) frees none of the memfd's
/// slots: the predecessor, serving on, still reads its data (past 64 freed chunks the store
/// would give their pages back to the kernel).
#[test]
fn a_successor_dropped_before_the_commit_leaves_the_data_alone() {
    let f = Fuse::new();
    let (e, fh) = f.create(ROOT, b"big", 0o644, libc::O_RDWR as u32).map(with_fh).unwrap();
    let big = data(13, 8 << 20);
    for (i, part) in big.chunks(1 << 20).enumerate() {
        f.write(e.nodeid, fh, (i << 20) as u64, part).unwrap();
    }
    let base = wire(&f.fs().precopy());
    f.write(e.nodeid, fh, 0, b"changed").unwrap();
    let changes = wire(&f.fs().changes().unwrap());
    drop(rebuilt(&f, &base, &changes).unwrap());
    let whole = wire(&f.fs().save());
    drop(RamFs::restore(RamFsConfig::default(), &whole, memfd(&f)).unwrap());
    let mut expected = big.clone();
    expected[..7].copy_from_slice(b"changed");
    for (i, part) in expected.chunks(1 << 20).enumerate() {
        assert!(f.read(e.nodeid, fh, (i << 20) as u64, 1 << 20).unwrap() == part, "MiB {i} of the data");
    }
}

/// Changes are the old process's word, checked as untrusted input: valid changes mangled at
/// random (numbers swapped, runs moved, entries and handles pointed elsewhere, items
/// repeated or dropped) are applied or refused, never a panic; what is applied holds
/// together (it saves and restores again).
#[test]
fn mangled_changes_are_refused_or_applied_never_a_panic() {
    let (f, a, b, x, xfh) = filled();
    let base = f.fs().precopy();
    some_changes(&f, a, b, (x, xfh));
    f.rename(b, b"f5", a, b"f5").unwrap();
    f.mkdir(a, b"dd", 0o755).unwrap();
    let good = f.fs().changes().unwrap();
    let mut rnd = xorshift(0x9e37_79b9_7f4a_7c15u64);
    let (mut applied, mut refused) = (0, 0);
    for _ in 0..2000 {
        let mut c = good.clone();
        for _ in 0..1 + rnd(3) {
            let inos: Vec<u64> =
                base.inodes.iter().map(|i| i.ino).chain(c.inodes.iter().map(|i| i.ino)).collect();
            let any_ino = |r: u64| inos[(r % inos.len() as u64) as usize];
            match rnd(12) {
                0 if !c.inodes.is_empty() => {
                    let k = rnd(c.inodes.len() as u64) as usize;
                    c.inodes[k].ino = any_ino(rnd(1000));
                }
                1 if !c.inodes.is_empty() => {
                    let k = rnd(c.inodes.len() as u64) as usize;
                    if let BodyState::File(r) = &mut c.inodes[k].body {
                        r.push((rnd(64), rnd(u64::from(c.store.next) + 4) as u32, 1 + rnd(4) as u32));
                    }
                }
                2 => c.gone.push(any_ino(rnd(1000))),
                3 if !c.names.is_empty() => {
                    let k = rnd(c.names.len() as u64) as usize;
                    c.names[k].2 = Some((rnd(200), any_ino(rnd(1000)), 8));
                }
                4 if !c.names.is_empty() => {
                    let k = rnd(c.names.len() as u64) as usize;
                    let dup = c.names[k].clone();
                    c.names.push(dup);
                }
                5 if !c.dirs.is_empty() => {
                    let k = rnd(c.dirs.len() as u64) as usize;
                    c.dirs[k].1 = if rnd(2) == 0 { None } else { Some((any_ino(rnd(1000)), rnd(300))) };
                }
                6 => c.handles.push((rnd(c.next_fh + 3), Some((any_ino(rnd(1000)), 2)))),
                7 if !c.handles.is_empty() => {
                    c.handles.remove(rnd(c.handles.len() as u64) as usize);
                }
                8 => c.store.resident.push(rnd(u64::from(c.store.next) + 2) as u32),
                9 if !c.inodes.is_empty() => {
                    let k = rnd(c.inodes.len() as u64) as usize;
                    c.inodes[k].kind = [libc::S_IFDIR, libc::S_IFREG, libc::S_IFLNK][rnd(3) as usize];
                }
                10 => c.next_ino = c.next_ino.wrapping_sub(rnd(3)),
                _ if !c.names.is_empty() => {
                    c.names.remove(rnd(c.names.len() as u64) as usize);
                }
                _ => {}
            }
        }
        match rebuilt(&f, &base, &c) {
            Ok(g) => {
                applied += 1;
                let again = RamFs::restore(RamFsConfig::default(), &g.save(), memfd(&f));
                assert!(again.is_ok(), "applied changes that do not hold together: {:?}", again.err());
            }
            Err(_) => refused += 1,
        }
    }
    assert!(refused > 500 && applied > 0, "{applied} applied, {refused} refused");
}
