//! The channel a live update talks over (the serving process and its supervisor, the old
//! serving process and the new one): a unix stream socket carrying typed messages, each a
//! JSON body with the descriptors that go with it.
//!
//! One message on the wire: a 16-byte header (magic, body length, descriptor count, zero), then
//! the descriptors in groups of at most [`MAX_GROUP_FDS`], each group attached to one byte that
//! says how many it holds, then the body. A sender writes a message without descriptors at
//! once, and the last group's byte with the body (two system calls for a message of few
//! descriptors): the bytes are the same. The receiver reads the header and each group's byte
//! with `recvmsg`, so no descriptor is attached to bytes a plain read takes. Everything is
//! bounded: the body ([`MAX_BODY`]), the descriptors ([`MAX_FILES`]) and the time a message
//! may take to arrive; the peer is another process of ours, but a confined one the guest talks
//! to, so a bad message is an error, never a panic or a wait without end.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;
use virtiofs_device::vfio_user::wire::{recv_group, send_group, MAX_GROUP_FDS};

/// "VFUP", little-endian.
const MAGIC: u32 = 0x5055_4656;
/// The largest body accepted (a RAM filesystem of many files says much).
pub const MAX_BODY: usize = 512 << 20;
/// The most descriptors one message may carry (a shared directory's nodes each hold one; the
/// receiver's `RLIMIT_NOFILE` is the tighter bound, and exceeding it fails the receive).
pub const MAX_FILES: usize = 1 << 20;
const HEADER: usize = 16;
/// How long a send may wait for the peer to read (a peer that stopped reading fails the send,
/// and with it the update, instead of holding the sender).
pub const SEND_BOUND: Duration = Duration::from_secs(30);

/// Why a message could not be sent or received.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// The socket failed.
    #[error("handover channel")]
    Io(#[from] io::Error),
    /// The peer closed the channel.
    #[error("the other process closed the channel")]
    Closed,
    /// Nothing came in time.
    #[error("no message within {0:?}")]
    Timeout(Duration),
    /// What came is not a message of this protocol.
    #[error("bad message: {0}")]
    Bad(String),
}

/// One end of a channel.
#[derive(Debug)]
pub struct Channel {
    sock: UnixStream,
}

impl Channel {
    /// A channel over `sock` (made blocking for sends, each write waiting at most
    /// [`SEND_BOUND`] for the peer to read; receives wait with a bound).
    pub fn new(sock: UnixStream) -> io::Result<Self> {
        sock.set_nonblocking(false)?;
        sock.set_write_timeout(Some(SEND_BOUND))?;
        Ok(Channel { sock })
    }

    /// Two connected ends.
    pub fn pair() -> io::Result<(Channel, Channel)> {
        let (a, b) = UnixStream::pair()?;
        Ok((Channel::new(a)?, Channel::new(b)?))
    }

    /// The socket (to pass it to another process).
    pub fn socket(&self) -> &UnixStream {
        &self.sock
    }

    /// Sends `msg` with `files`.
    pub fn send<T: Serialize>(&self, msg: &T, files: &[BorrowedFd<'_>]) -> Result<(), ChannelError> {
        let body = serde_json::to_vec(msg).map_err(|e| ChannelError::Bad(e.to_string()))?;
        if body.len() > MAX_BODY || files.len() > MAX_FILES {
            return Err(ChannelError::Bad(format!(
                "{} bytes, {} descriptors: too large",
                body.len(),
                files.len()
            )));
        }
        let mut header = [0u8; HEADER];
        header[..4].copy_from_slice(&MAGIC.to_le_bytes());
        header[4..8].copy_from_slice(&(body.len() as u32).to_le_bytes());
        header[8..12].copy_from_slice(&(files.len() as u32).to_le_bytes());
        if files.is_empty() {
            // Header and body in one write: nothing to keep apart.
            let mut all = Vec::with_capacity(HEADER + body.len());
            all.extend_from_slice(&header);
            all.extend_from_slice(&body);
            (&self.sock).write_all(&all)?;
            return Ok(());
        }
        (&self.sock).write_all(&header)?;
        let groups = files.len().div_ceil(MAX_GROUP_FDS);
        for (i, group) in files.chunks(MAX_GROUP_FDS).enumerate() {
            let fds: Vec<i32> = group.iter().map(|f| f.as_raw_fd()).collect();
            let count = [group.len() as u8];
            // The last group's byte goes with the body in one `sendmsg`: the receiver takes
            // the descriptors with that byte (a read stops after the bytes that carry them)
            // and reads the body after it, as if they had come apart.
            let last = i + 1 == groups;
            let bufs: &[&[u8]] = if last { &[&count, &body] } else { &[&count] };
            let sent = send_group(&self.sock, bufs, &fds)?;
            if sent == 0 {
                return Err(ChannelError::Io(io::Error::new(io::ErrorKind::WriteZero, "descriptor group")));
            }
            if last {
                // A stream socket may take part of it (a timeout, a signal).
                (&self.sock).write_all(&body[sent - 1..])?;
            } else if sent != 1 {
                return Err(ChannelError::Io(io::Error::new(io::ErrorKind::WriteZero, "descriptor group")));
            }
        }
        Ok(())
    }

    /// Receives one message, waiting at most `bound` for all of it.
    pub fn recv<T: DeserializeOwned>(&self, bound: Duration) -> Result<(T, Vec<File>), ChannelError> {
        let deadline = Instant::now() + bound;
        let mut header = [0u8; HEADER];
        self.fill(&mut header, deadline, bound)?;
        let word = |i: usize| u32::from_le_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
        if word(0) != MAGIC || word(12) != 0 {
            return Err(ChannelError::Bad("not a handover message".into()));
        }
        let (len, count) = (word(4) as usize, word(8) as usize);
        if len > MAX_BODY || count > MAX_FILES {
            return Err(ChannelError::Bad(format!("{len} bytes, {count} descriptors: too large")));
        }
        if count > MAX_GROUP_FDS {
            // Room for them all in one growth of the table (a process of several threads),
            // unless it was made before (a new serving process makes it while it has one).
            let n = count.saturating_add(4096).try_into().unwrap_or(u32::MAX);
            crate::sys::reserve_descriptors(&self.sock, n);
        }
        let mut files = Vec::with_capacity(count);
        while files.len() < count {
            let want = (count - files.len()).min(MAX_GROUP_FDS);
            let mut byte = [0u8; 1];
            let before = files.len();
            let got = self.recv_some(&mut byte, &mut files, deadline, bound)?;
            if got.truncated_fds || usize::from(byte[0]) != want || files.len() - before != want {
                return Err(ChannelError::Bad("a descriptor group does not match its count".into()));
            }
        }
        let mut body = vec![0u8; len];
        self.fill(&mut body, deadline, bound)?;
        let msg = serde_json::from_slice(&body).map_err(|e| ChannelError::Bad(e.to_string()))?;
        Ok((msg, files))
    }

    /// Reads exactly `buf.len()` bytes that carry no descriptor.
    fn fill(&self, buf: &mut [u8], deadline: Instant, bound: Duration) -> Result<(), ChannelError> {
        let mut at = 0;
        while at < buf.len() {
            let mut stray = Vec::new();
            let got = self.recv_some(&mut buf[at..], &mut stray, deadline, bound)?;
            if !stray.is_empty() || got.truncated_fds {
                return Err(ChannelError::Bad("descriptors where none belong".into()));
            }
            at += got.bytes;
        }
        Ok(())
    }

    /// One `recvmsg` of at most `buf.len()` bytes (at least one), waiting until `deadline`.
    fn recv_some(
        &self,
        buf: &mut [u8],
        files: &mut Vec<File>,
        deadline: Instant,
        bound: Duration,
    ) -> Result<virtiofs_device::vfio_user::wire::RecvResult, ChannelError> {
        loop {
            match recv_group(&self.sock, buf, files) {
                Ok(r) if r.bytes == 0 => return Err(ChannelError::Closed),
                Ok(r) => return Ok(r),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(ChannelError::Io(e)),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !crate::sys::wait_readable(&self.sock.as_fd(), left)? {
                return Err(ChannelError::Timeout(bound));
            }
        }
    }
}

/// A reader of one end's messages that reads ahead (the supervisor's reader of a serving
/// process's checkpoints: many small messages, one `recvmsg` for several when they are
/// there). A `recvmsg` stops after the bytes that carry descriptors, so a group's
/// descriptors have come once its count byte has: they are taken in the order they came. The
/// channel is read through this alone from its first message to its last (what it read
/// ahead is its own).
pub struct ReadAhead<'a> {
    chan: &'a Channel,
    buf: Vec<u8>,
    /// The bytes read and not yet taken: `buf[start..end]`.
    start: usize,
    end: usize,
    files: std::collections::VecDeque<File>,
}

/// What a [`ReadAhead`] reads at a time, at least.
const READ_AHEAD: usize = 64 << 10;

impl<'a> ReadAhead<'a> {
    /// Reads `chan`'s messages.
    pub fn new(chan: &'a Channel) -> Self {
        ReadAhead { chan, buf: vec![0; READ_AHEAD], start: 0, end: 0, files: Default::default() }
    }

    /// Whether a message has begun: bytes read ahead, or readable now.
    pub fn more(&self) -> bool {
        self.end > self.start
            || matches!(crate::sys::wait_readable(&self.chan.sock, Duration::ZERO), Ok(true))
    }

    /// Receives one message, waiting at most `bound` for all of it (as [`Channel::recv`]).
    pub fn recv<T: DeserializeOwned>(&mut self, bound: Duration) -> Result<(T, Vec<File>), ChannelError> {
        let deadline = Instant::now() + bound;
        self.need(HEADER, deadline, bound)?;
        let h = &self.buf[self.start..self.start + HEADER];
        let word = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        if word(0) != MAGIC || word(12) != 0 {
            return Err(ChannelError::Bad("not a handover message".into()));
        }
        let (len, count) = (word(4) as usize, word(8) as usize);
        if len > MAX_BODY || count > MAX_FILES {
            return Err(ChannelError::Bad(format!("{len} bytes, {count} descriptors: too large")));
        }
        self.start += HEADER;
        let mut files = Vec::with_capacity(count);
        while files.len() < count {
            let want = (count - files.len()).min(MAX_GROUP_FDS);
            self.need(1, deadline, bound)?;
            let byte = self.buf[self.start];
            self.start += 1;
            if usize::from(byte) != want || self.files.len() < want {
                return Err(ChannelError::Bad("a descriptor group does not match its count".into()));
            }
            files.extend(self.files.drain(..want));
        }
        self.need(len, deadline, bound)?;
        let msg = serde_json::from_slice(&self.buf[self.start..self.start + len])
            .map_err(|e| ChannelError::Bad(e.to_string()));
        self.start += len;
        if self.start == self.end && self.buf.len() > 4 * READ_AHEAD {
            self.buf = vec![0; READ_AHEAD]; // a big message's room goes
            (self.start, self.end) = (0, 0);
        }
        Ok((msg?, files))
    }

    /// Reads until `n` bytes are there, waiting until `deadline`.
    fn need(&mut self, n: usize, deadline: Instant, bound: Duration) -> Result<(), ChannelError> {
        while self.end - self.start < n {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                (self.start, self.end) = (0, self.end - self.start);
            }
            if self.buf.len() < n.max(READ_AHEAD) {
                self.buf.resize(n.max(READ_AHEAD), 0);
            }
            let mut got = Vec::new();
            let r = self.chan.recv_some(&mut self.buf[self.end..], &mut got, deadline, bound)?;
            if r.truncated_fds {
                return Err(ChannelError::Bad("more descriptors than a group holds".into()));
            }
            self.files.extend(got);
            self.end += r.bytes;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek};

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Note {
        text: String,
    }

    /// A message and 300 descriptors (two groups) arrive whole and in order; a garbled header,
    /// an oversized length, a silent peer and a closed one are errors, not waits.
    #[test]
    fn messages_and_their_descriptors_arrive_and_bad_ones_are_refused() {
        let (a, b) = Channel::pair().unwrap();
        let mut files = Vec::new();
        for i in 0..300u32 {
            let mut f = tempfile::tempfile().unwrap();
            f.write_all(&[i as u8]).unwrap();
            files.push(f);
        }
        let fds: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
        a.send(&Note { text: "hello".into() }, &fds).unwrap();
        let (note, got): (Note, Vec<File>) = b.recv(Duration::from_secs(5)).unwrap();
        assert_eq!(note.text, "hello");
        assert_eq!(got.len(), 300);
        for (i, mut f) in got.into_iter().enumerate() {
            let mut byte = [0u8; 1];
            f.rewind().unwrap();
            f.read_exact(&mut byte).unwrap();
            assert_eq!(byte[0], i as u8, "descriptor {i} out of order");
        }

        let e = b.recv::<Note>(Duration::from_millis(50)).unwrap_err();
        assert!(matches!(e, ChannelError::Timeout(_)), "{e}");
        (&a.sock).write_all(&[0u8; 16]).unwrap();
        let e = b.recv::<Note>(Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, ChannelError::Bad(_)), "{e}");
        let mut header = [0u8; 16];
        header[..4].copy_from_slice(&MAGIC.to_le_bytes());
        header[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        (&a.sock).write_all(&header).unwrap();
        let e = b.recv::<Note>(Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, ChannelError::Bad(_)), "{e}");
        drop(a);
        let e = b.recv::<Note>(Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, ChannelError::Closed), "{e}");
    }

    /// Messages of no, few and many descriptors, sent back to back, read ahead: each with its
    /// own descriptors, in order; then the end.
    #[test]
    fn messages_read_ahead_keep_their_descriptors() {
        let (a, b) = Channel::pair().unwrap();
        let mut files = Vec::new();
        for i in 0..600u32 {
            let mut f = tempfile::tempfile().unwrap();
            f.write_all(&(i as u16).to_le_bytes()).unwrap();
            files.push(f);
        }
        let sizes = [0usize, 1, 2, 0, 300, 1, 0, 253, 3, 40];
        // More than a socket buffer holds: sent while they are read.
        let sender = std::thread::spawn(move || {
            let fds: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
            let mut at = 0;
            for (i, &n) in sizes.iter().enumerate() {
                a.send(&Note { text: format!("m{i}").repeat(1 + i * 3000) }, &fds[at..at + n]).unwrap();
                at += n;
            }
        });
        let mut r = ReadAhead::new(&b);
        let mut at = 0u16;
        for (i, &n) in sizes.iter().enumerate() {
            let (note, got): (Note, Vec<File>) = r.recv(Duration::from_secs(5)).unwrap();
            assert_eq!(note.text, format!("m{i}").repeat(1 + i * 3000));
            assert_eq!(got.len(), n, "message {i}");
            for mut f in got {
                let mut two = [0u8; 2];
                f.rewind().unwrap();
                f.read_exact(&mut two).unwrap();
                assert_eq!(u16::from_le_bytes(two), at, "message {i}: a descriptor out of order");
                at += 1;
            }
        }
        sender.join().unwrap();
        let e = r.recv::<Note>(Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, ChannelError::Closed), "{e}");
    }
}
