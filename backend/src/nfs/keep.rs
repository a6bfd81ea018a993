//! The NFS backend's tables kept for a crash (issue 24): the node table, the open handles and
//! the UNSTABLE store's index, as fixed-size records in a memfd the daemon's supervisor holds,
//! written as the tables change (under their own mutexes, a few plain stores each: no system
//! call, no lock of its own). A process started after the serving one was killed reads them
//! back (`NfsState::kept`, in `state.rs`) into the same `NfsState` a live update hands over, and goes on
//! writing the same records; the store's bytes are in their own memfd (held the same way).
//!
//! Every record is written body first and its head word last, and a head word is one atomic
//! store: a record caught half-written by the kill reads as its previous state (a node or a
//! handle not made yet, a write not stored yet), which belongs to a request still in flight,
//! executed again by the new process. What is read back:
//!
//! - a node: its slot, generation, file handle, lookup count, and silly name's directory; its
//!   open count is recounted from the handles (a handle is made after its node's count went up
//!   and goes before it goes down, so the two could disagree after a kill);
//! - a handle: its slot, generation and open file (node, flags, READDIR cookie verifier);
//! - a stored write: its slot, file, handle, writer, offset, length, pages (each entry writes
//!   its whole page chain as it is made), verifier or resend mark, and order numbers. A write
//!   whose WRITE had no answer yet is dropped: its request is in flight and runs again.
//!
//! The mount (export, root handle, addresses, the server's sizes) is written once, as JSON in
//! the header page.

use std::fs::File;
use std::os::fd::BorrowedFd;

use super::wire::Fh;
use crate::nfs::conn::Cred;
use crate::ramfs::sys::SharedWords;

/// The records' format: 2 holds NFSv4's 128-byte handles and a node's lock mark.
const MAGIC: u64 = u64::from_le_bytes(*b"VFDNFSK2");
/// A set bit 63 in a head word: the record is in use.
const LIVE: u64 = 1 << 63;
/// Bit 62 of a handle's head: a directory.
const DIR: u64 = 1 << 62;
/// No next page.
const NONE: u64 = u32::MAX as u64;
/// Bytes per page of the UNSTABLE store (`unstable::PAGE`).
const PAGE: usize = 4096;

const H_MAGIC: usize = 0;
const H_NODES: usize = 1;
const H_HANDLES: usize = 2;
const H_PAGES: usize = 3;
const H_NODE_SLOTS: usize = 4;
const H_SEQ: usize = 5;
const H_ANSWERS: usize = 6;
const H_ENTRY_SLOTS: usize = 7;
const H_MOUNT_LEN: usize = 8;
const MOUNT_AT: usize = 16;
const HEADER_WORDS: usize = 512;

/// A file handle's words: NFSv4's largest (128 bytes; NFSv3's are 64 at most).
const FH_WORDS: usize = 16;
/// A node: head, lookups, silly name's head, handle, silly name's directory, lock mark.
const NODE_WORDS: usize = 4 + 2 * FH_WORDS;
/// The lock mark's word in a node's record.
const NODE_LOCKED: usize = 3 + 2 * FH_WORDS;
const HANDLE_WORDS: usize = 5;
const ENTRY_WORDS: usize = 18 + FH_WORDS;

/// What the verifier word of a stored write means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeptVerf {
    /// Its WRITE is on the wire.
    Unknown,
    /// Its WRITE's reply gave this verifier.
    Known([u8; 8]),
    /// To be sent again.
    Resend,
}

/// The export's mount as the records' header keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeptMount {
    /// The export's path.
    pub export: String,
    /// Its root handle.
    pub root: Vec<u8>,
    /// The NFS program's address.
    pub nfs_addr: std::net::SocketAddr,
    /// The MOUNT program's address.
    pub mount_addr: std::net::SocketAddr,
    /// The server's transfer sizes: read, write, directory, largest file.
    pub limits: (u32, u32, u32, u64),
    /// NFSv4.1: the client the function is to the server (`None` with NFSv3).
    #[serde(default)]
    pub v41: Option<KeptClient>,
}

/// An NFSv4.1 export's client as the records' header keeps it: what a process started after
/// a crash needs to be the same client again, in a new incarnation (a new verifier: the server
/// drops the dead process's opens and locks).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeptClient {
    /// The owner id.
    pub owner: Vec<u8>,
    /// The server's addresses (session trunking).
    pub addrs: Vec<std::net::SocketAddr>,
}

/// The records (see the module documentation).
#[derive(Debug)]
pub struct NfsKeep {
    words: SharedWords,
    nodes: usize,
    handles: usize,
    pages: usize,
}

fn fh_words(fh: &[u8]) -> [u64; FH_WORDS] {
    let mut b = [0u8; FH_WORDS * 8];
    b[..fh.len().min(FH_WORDS * 8)].copy_from_slice(&fh[..fh.len().min(FH_WORDS * 8)]);
    std::array::from_fn(|k| u64::from_le_bytes(b[k * 8..k * 8 + 8].try_into().unwrap_or_default()))
}

impl NfsKeep {
    fn layout(nodes: usize, handles: usize, pages: usize) -> Option<[usize; 4]> {
        let node_at = HEADER_WORDS;
        let handle_at = node_at.checked_add(nodes.checked_mul(NODE_WORDS)?)?;
        let entry_at = handle_at.checked_add(handles.checked_mul(HANDLE_WORDS)?)?;
        let page_at = entry_at.checked_add(pages.checked_mul(ENTRY_WORDS)?)?;
        let end = page_at.checked_add(pages)?;
        Some([handle_at, entry_at, page_at, end])
    }

    /// New records for an export mounted as `mount`, with room for `nodes` nodes, `handles`
    /// handles and a store of `pages` pages (as many entries at most), sparse in a new memfd.
    pub fn create(mount: &KeptMount, nodes: usize, handles: usize, pages: usize) -> std::io::Result<NfsKeep> {
        let bad = || std::io::Error::from(std::io::ErrorKind::InvalidInput);
        let [.., end] = Self::layout(nodes, handles, pages).ok_or_else(bad)?;
        let json = serde_json::to_vec(mount).map_err(|_| bad())?;
        if json.len() > (HEADER_WORDS - MOUNT_AT) * 8 {
            return Err(bad());
        }
        let words = SharedWords::new("virtiofs-nfs-kept", end)?;
        for (k, chunk) in json.chunks(8).enumerate() {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            words.store(MOUNT_AT + k, u64::from_le_bytes(b));
        }
        words.store(H_MOUNT_LEN, json.len() as u64);
        words.store(H_NODES, nodes as u64);
        words.store(H_HANDLES, handles as u64);
        words.store(H_PAGES, pages as u64);
        words.store(H_MAGIC, MAGIC);
        Ok(NfsKeep { words, nodes, handles, pages })
    }

    /// The records in `memfd` (a dead process's), their header checked.
    pub fn open(memfd: File) -> Result<NfsKeep, String> {
        let words = SharedWords::from_memfd(memfd).map_err(|e| format!("the NFS records: {e}"))?;
        if words.len() < HEADER_WORDS || words.load(H_MAGIC) != MAGIC {
            return Err("the NFS records are not this firmware's".into());
        }
        let room = |i| usize::try_from(words.load(i)).map_err(|_| "the NFS records' sizes".to_string());
        let (nodes, handles, pages) = (room(H_NODES)?, room(H_HANDLES)?, room(H_PAGES)?);
        match Self::layout(nodes, handles, pages) {
            Some([.., end]) if end <= words.len() => Ok(NfsKeep { words, nodes, handles, pages }),
            _ => Err("the NFS records are shorter than their header says".into()),
        }
    }

    /// The memfd (for the supervisor to hold).
    pub fn memfd(&self) -> BorrowedFd<'_> {
        self.words.memfd()
    }

    /// Whether these records have room for tables of these sizes.
    pub fn fits(&self, nodes: usize, handles: usize, pages: usize) -> bool {
        self.nodes >= nodes && self.handles >= handles && self.pages == pages
    }

    /// The mount the records were made for.
    pub fn mount(&self) -> Result<KeptMount, String> {
        let len = usize::try_from(self.words.load(H_MOUNT_LEN)).unwrap_or(usize::MAX);
        if len > (HEADER_WORDS - MOUNT_AT) * 8 {
            return Err("the NFS records' mount is too long".into());
        }
        let bytes: Vec<u8> = (0..len.div_ceil(8))
            .flat_map(|k| self.words.load(MOUNT_AT + k).to_le_bytes())
            .take(len)
            .collect();
        serde_json::from_slice(&bytes).map_err(|e| format!("the NFS records' mount: {e}"))
    }

    fn write_fh(&self, at: usize, fh: &[u8]) {
        for (k, w) in fh_words(fh).into_iter().enumerate() {
            self.words.store(at + k, w);
        }
    }

    fn read_fh(&self, at: usize, len: u64) -> Result<Vec<u8>, String> {
        let len =
            usize::try_from(len).ok().filter(|&l| l <= FH_WORDS * 8).ok_or("a kept file handle's length")?;
        Ok((0..FH_WORDS).flat_map(|k| self.words.load(at + k).to_le_bytes()).take(len).collect())
    }

    // ---- nodes ----

    fn node(&self, i: usize) -> Option<usize> {
        (i < self.nodes).then_some(HEADER_WORDS + i * NODE_WORDS)
    }

    /// The node table uses `n` slots.
    pub(super) fn node_slots(&self, n: usize) {
        self.words.store(H_NODE_SLOTS, n as u64);
    }

    /// Slot `i` holds a new node of `generation` for `fh`, with one lookup reference.
    pub(super) fn node_made(&self, i: usize, generation: u32, fh: &Fh) {
        let Some(at) = self.node(i) else { return };
        self.write_fh(at + 3, fh.as_bytes());
        self.words.store(at + 1, 1);
        self.words.store(at + 2, 0);
        self.words.store(at + NODE_LOCKED, 0);
        self.words.store(at, LIVE | (fh.as_bytes().len() as u64) << 32 | u64::from(generation));
    }

    /// Node `i` holds NFSv4.1 lock state on the server (or no longer does): after a crash its
    /// locks are gone with the dead process's client, and the file is marked lost.
    pub(super) fn node_locked(&self, i: usize, locked: bool) {
        if let Some(at) = self.node(i) {
            self.words.store(at + NODE_LOCKED, u64::from(locked));
        }
    }

    /// Node `i`'s lookup references.
    pub(super) fn node_lookups(&self, i: usize, n: u64) {
        if let Some(at) = self.node(i) {
            self.words.store(at + 1, n);
        }
    }

    /// Node `i` went; its slot's next generation is `generation`.
    pub(super) fn node_gone(&self, i: usize, generation: u32) {
        if let Some(at) = self.node(i) {
            self.words.store(at, u64::from(generation));
        }
    }

    /// Node `i`'s silly name is in directory `dir` (or it has none).
    pub(super) fn node_silly(&self, i: usize, dir: Option<&Fh>) {
        let Some(at) = self.node(i) else { return };
        match dir {
            Some(d) => {
                self.write_fh(at + 3 + FH_WORDS, d.as_bytes());
                self.words.store(at + 2, LIVE | d.as_bytes().len() as u64);
            }
            None => self.words.store(at + 2, 0),
        }
    }

    // ---- handles ----

    fn handle(&self, i: usize) -> Option<usize> {
        (i < self.handles).then_some(HEADER_WORDS + self.nodes * NODE_WORDS + i * HANDLE_WORDS)
    }

    /// Handle slot `i` of `generation` holds `file`.
    pub(super) fn handle_opened(&self, i: usize, generation: u32, file: &KeptHandle) {
        let Some(at) = self.handle(i) else { return };
        self.words.store(at + 1, file.nodeid);
        self.words.store(at + 2, u64::from(file.flags));
        self.words.store(at + 3, u64::from_le_bytes(file.cookieverf));
        self.words.store(at + 4, file.eof_at);
        let dir = if file.dir { DIR } else { 0 };
        self.words.store(at, LIVE | dir | u64::from(generation));
    }

    /// Directory handle `i`'s READDIR cookie verifier and end.
    pub(super) fn handle_cookie(&self, i: usize, verf: [u8; 8], eof_at: u64) {
        if let Some(at) = self.handle(i) {
            self.words.store(at + 4, eof_at);
            self.words.store(at + 3, u64::from_le_bytes(verf));
        }
    }

    /// Handle slot `i` (of `generation`) is closed.
    pub(super) fn handle_closed(&self, i: usize, generation: u32) {
        if let Some(at) = self.handle(i) {
            self.words.store(at, u64::from(generation));
        }
    }

    // ---- the UNSTABLE store ----

    fn entry(&self, i: usize) -> Option<usize> {
        (i < self.pages)
            .then_some(HEADER_WORDS + self.nodes * NODE_WORDS + self.handles * HANDLE_WORDS + i * ENTRY_WORDS)
    }

    fn page(&self, p: usize) -> Option<usize> {
        (p < self.pages).then_some(
            HEADER_WORDS
                + self.nodes * NODE_WORDS
                + self.handles * HANDLE_WORDS
                + self.pages * ENTRY_WORDS
                + p,
        )
    }

    /// The store's order and answer counters, and how many entry slots it uses.
    pub(super) fn store_counters(&self, seq: u64, answers: u64, slots: usize) {
        self.words.store(H_SEQ, seq);
        self.words.store(H_ANSWERS, answers);
        self.words.store(H_ENTRY_SLOTS, slots as u64);
    }

    /// Page `p` is followed by `next` (`u32::MAX`: none) in its entry's chain.
    pub(super) fn page_next(&self, p: u32, next: u32) {
        if let Some(at) = self.page(p as usize) {
            self.words.store(at, u64::from(next));
        }
    }

    /// Entry slot `i` holds a write (its pages' chain written before).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn entry_made(
        &self,
        i: usize,
        file: u64,
        fh: &Fh,
        cred: &Cred,
        offset: u64,
        len: u32,
        first: u32,
        seq: u64,
        answered: u64,
        verf: KeptVerf,
    ) {
        let Some(at) = self.entry(i) else { return };
        let w = &self.words;
        w.store(at + 1, file);
        w.store(at + 2, offset);
        w.store(at + 3, u64::from(first));
        w.store(at + 4, seq);
        w.store(at + 7, u64::from(cred.uid) | u64::from(cred.gid) << 32);
        w.store(at + 8, u64::from(cred.ngroups));
        for k in 0..8 {
            w.store(at + 9 + k, u64::from(cred.groups[2 * k]) | u64::from(cred.groups[2 * k + 1]) << 32);
        }
        w.store(at + 17, fh.as_bytes().len() as u64);
        self.write_fh(at + 18, fh.as_bytes());
        self.entry_verf(i, len, answered, verf);
    }

    /// Entry `i`'s verifier (and answer number) changed.
    pub(super) fn entry_verf(&self, i: usize, len: u32, answered: u64, verf: KeptVerf) {
        let Some(at) = self.entry(i) else { return };
        let tag = match verf {
            KeptVerf::Unknown => 0,
            KeptVerf::Known(v) => {
                self.words.store(at + 6, u64::from_le_bytes(v));
                1
            }
            KeptVerf::Resend => 2,
        };
        self.words.store(at + 5, answered);
        self.words.store(at, LIVE | tag << 32 | u64::from(len));
    }

    /// Entry `i` went.
    pub(super) fn entry_gone(&self, i: usize) {
        if let Some(at) = self.entry(i) {
            self.words.store(at, 0);
        }
    }

    /// Node slots in use.
    pub(super) fn node_slots_used(&self) -> Result<usize, String> {
        let slots = usize::try_from(self.words.load(H_NODE_SLOTS)).unwrap_or(usize::MAX);
        if slots == 0 || slots > self.nodes {
            return Err(format!("{slots} kept node slots, room for {}", self.nodes));
        }
        Ok(slots)
    }

    /// Node slot `i`: its generation, and if it holds a node, the node.
    pub(super) fn node_record(&self, i: usize) -> Result<(u32, Option<KeptNode>), String> {
        let at = self.node(i).ok_or("a node slot past the records")?;
        let w = &self.words;
        let head = w.load(at);
        if head & LIVE == 0 {
            return Ok((head as u32, None));
        }
        let silly_head = w.load(at + 2);
        let silly = (silly_head & LIVE != 0)
            .then(|| self.read_fh(at + 3 + FH_WORDS, silly_head & 0xff))
            .transpose()?;
        let node = KeptNode {
            fh: self.read_fh(at + 3, (head >> 32) & 0xff)?,
            nlookup: w.load(at + 1),
            silly,
            locked: w.load(at + NODE_LOCKED) != 0,
        };
        Ok((head as u32, Some(node)))
    }

    /// Handle slots.
    pub(super) fn handle_room(&self) -> usize {
        self.handles
    }

    /// Handle slot `i`: `None` if never used; else its generation and, if open, what.
    pub(super) fn handle_record(&self, i: usize) -> Option<(u32, Option<KeptHandle>)> {
        let at = self.handle(i)?;
        let w = &self.words;
        let head = w.load(at);
        if head == 0 {
            return None;
        }
        let open = (head & LIVE != 0).then(|| KeptHandle {
            nodeid: w.load(at + 1),
            flags: w.load(at + 2) as u32,
            dir: head & DIR != 0,
            cookieverf: w.load(at + 3).to_le_bytes(),
            eof_at: w.load(at + 4),
        });
        Some((head as u32, open))
    }

    /// The store's pages, order and answer counters, and entry slots in use.
    pub(super) fn store_header(&self) -> (usize, u64, u64, usize) {
        let w = &self.words;
        let slots = usize::try_from(w.load(H_ENTRY_SLOTS)).unwrap_or(usize::MAX).min(self.pages);
        (self.pages, w.load(H_SEQ), w.load(H_ANSWERS), slots)
    }

    /// Entry slot `i`: `None` if it holds no write.
    pub(super) fn entry_record(&self, i: usize) -> Result<Option<KeptEntry>, String> {
        let at = self.entry(i).ok_or("an entry slot past the records")?;
        let w = &self.words;
        let head = w.load(at);
        if head & LIVE == 0 {
            return Ok(None);
        }
        let verf = match (head >> 32) & 3 {
            0 => KeptVerf::Unknown,
            1 => KeptVerf::Known(w.load(at + 6).to_le_bytes()),
            2 => KeptVerf::Resend,
            _ => return Err("a kept write's verifier mark".into()),
        };
        let len = head as u32;
        let need = (len as usize).div_ceil(PAGE).max(1);
        if need > self.pages {
            return Err("a kept write longer than the store".into());
        }
        let mut pages: Vec<(u32, u32)> = Vec::new();
        let mut page = w.load(at + 3);
        for _ in 0..need {
            let next = self
                .page(usize::try_from(page).unwrap_or(usize::MAX))
                .ok_or("a kept write's pages leave the store")?;
            let p = page as u32;
            match pages.last_mut() {
                Some((first, n)) if *first + *n == p => *n += 1,
                _ => pages.push((p, 1)),
            }
            page = w.load(next);
        }
        if page != NONE {
            return Err("a kept write's page chain is longer than its length".into());
        }
        let ids = w.load(at + 7);
        let ngroups = (w.load(at + 8) as usize).min(16);
        let groups =
            (0..16).map(|k| (w.load(at + 9 + k / 2) >> (32 * (k % 2))) as u32).take(ngroups).collect();
        Ok(Some(KeptEntry {
            file: w.load(at + 1),
            fh: self.read_fh(at + 18, w.load(at + 17))?,
            cred: (ids as u32, (ids >> 32) as u32, groups),
            offset: w.load(at + 2),
            len,
            pages,
            verf,
            seq: w.load(at + 4),
            answered: w.load(at + 5),
        }))
    }
}

/// A kept node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct KeptNode {
    pub(super) fh: Vec<u8>,
    pub(super) nlookup: u64,
    pub(super) silly: Option<Vec<u8>>,
    /// NFSv4.1: it held lock state on the server.
    pub(super) locked: bool,
}

/// A kept open handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct KeptHandle {
    pub(super) nodeid: u64,
    pub(super) flags: u32,
    pub(super) dir: bool,
    pub(super) cookieverf: [u8; 8],
    pub(super) eof_at: u64,
}

/// A kept write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct KeptEntry {
    pub(super) file: u64,
    pub(super) fh: Vec<u8>,
    pub(super) cred: (u32, u32, Vec<u32>),
    pub(super) offset: u64,
    pub(super) len: u32,
    pub(super) pages: Vec<(u32, u32)>,
    pub(super) verf: KeptVerf,
    pub(super) seq: u64,
    pub(super) answered: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount() -> KeptMount {
        KeptMount {
            export: "/export".into(),
            root: b"root-handle".to_vec(),
            nfs_addr: "127.0.0.1:2049".parse().unwrap(),
            mount_addr: "127.0.0.1:20048".parse().unwrap(),
            limits: (1 << 20, 1 << 20, 8192, u64::MAX),
            v41: None,
        }
    }

    #[test]
    fn a_record_reads_back_as_written_and_a_half_written_one_as_before() {
        let k = NfsKeep::create(&mount(), 8, 8, 16).unwrap();
        let root = Fh::new(b"root-handle").unwrap();
        k.node_slots(3);
        k.node_made(0, 0, &root);
        k.node_made(1, 1, &Fh::new(b"file-a").unwrap());
        k.node_lookups(1, 3);
        k.node_silly(1, Some(&Fh::new(b"dir").unwrap()));
        // Slot 2: killed before its head was stored.
        k.write_fh(k.node(2).unwrap() + 3, b"file-b");
        let file = KeptHandle { nodeid: (1 << 32) | 2, flags: 2, dir: false, cookieverf: [0; 8], eof_at: 0 };
        k.handle_opened(0, 1, &file);
        k.handle_opened(1, 1, &file);
        k.handle_closed(1, 1);
        for (p, n) in [(0, 1), (1, NONE as u32), (5, NONE as u32)] {
            k.page_next(p, n);
        }
        let cred = Cred { uid: 7, gid: 8, ngroups: 2, groups: [9; 16] };
        let fh = Fh::new(b"file-a").unwrap();
        k.entry_made(0, (1 << 32) | 2, &fh, &cred, 4096, 5000, 0, 1, 1, KeptVerf::Known(*b"verifier"));
        k.entry_made(1, (1 << 32) | 2, &fh, &cred, 0, 10, 5, 2, 0, KeptVerf::Unknown);
        k.store_counters(2, 1, 2);

        let again = NfsKeep::open(k.memfd().try_clone_to_owned().unwrap().into()).unwrap();
        assert_eq!(again.mount().unwrap(), mount());
        assert_eq!(again.node_slots_used().unwrap(), 3);
        assert_eq!(again.node_record(0).unwrap().1.unwrap().fh, b"root-handle");
        let (g, a) = again.node_record(1).unwrap();
        let a = a.unwrap();
        assert_eq!(
            (g, a.fh.as_slice(), a.nlookup, a.silly.as_deref()),
            (1, b"file-a".as_slice(), 3, Some(b"dir".as_slice()))
        );
        assert_eq!(again.node_record(2).unwrap(), (0, None), "the half-written node is not there");
        assert_eq!(again.handle_record(0), Some((1, Some(file))));
        assert_eq!(again.handle_record(1), Some((1, None)));
        assert_eq!(again.handle_record(2), None);
        assert_eq!(again.store_header(), (16, 2, 1, 2));
        let e = again.entry_record(0).unwrap().unwrap();
        assert_eq!(
            (e.offset, e.len, e.pages.as_slice(), e.verf),
            (4096, 5000, [(0, 2)].as_slice(), KeptVerf::Known(*b"verifier"))
        );
        assert_eq!(e.cred, (7, 8, vec![9, 9]));
        assert_eq!(again.entry_record(1).unwrap().unwrap().verf, KeptVerf::Unknown);
        assert_eq!(again.entry_record(2).unwrap(), None);
    }

    #[test]
    fn records_of_another_kind_or_a_broken_chain_are_refused() {
        let other = crate::ramfs::sys::SharedWords::new("x", 1024).unwrap();
        assert!(NfsKeep::open(other.memfd().try_clone_to_owned().unwrap().into()).is_err());
        let k = NfsKeep::create(&mount(), 4, 4, 4).unwrap();
        k.node_slots(1);
        k.node_made(0, 0, &Fh::new(b"root-handle").unwrap());
        k.page_next(0, 0); // a loop
        let fh = Fh::new(b"f").unwrap();
        k.entry_made(
            0,
            2,
            &fh,
            &Cred { uid: 0, gid: 0, ngroups: 0, groups: [0; 16] },
            0,
            8192,
            0,
            1,
            1,
            KeptVerf::Resend,
        );
        k.store_counters(1, 1, 1);
        assert!(k.entry_record(0).is_err());
    }
}
