//! A vfio-user client, written from the protocol specification (QEMU `docs/interop/vfio-user.rst`).
//!
//! The client plays QEMU's `vfio-user-pci` role: it connects to the device's UNIX socket, negotiates
//! the version, maps "guest RAM" for DMA, reads region/IRQ information and forwards register
//! accesses. It trusts nothing: every reply is checked for the reply type bit, the echoed message
//! id and command, the error bit/errno, and the payload sizes of the command it answers. A reply
//! with the error bit becomes [`ClientError::Remote`] carrying the server's errno.
//!
//! Besides typed calls, a raw API lets conformance tests send malformed messages and look at
//! whatever comes back: [`Client::send_raw`] (any bytes, any fds), [`Client::send_command`] (a
//! framed command, e.g. posted or pipelined), [`Client::call_raw`] (a command and its reply, error
//! replies included, fds kept), [`Client::recv_message`] and [`Client::try_recv_message`] (is a
//! reply there yet?). The device's conformance tests (`device/tests/vfio_user_conformance/`)
//! drive the server through this client rather than through the device's own wire structures,
//! so that a layout mistake on either side shows up instead of cancelling out.
//!
//! Message layout (all fields host-endian, i.e. little endian here):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 2 | message id (echoed in the reply) |
//! | 2 | 2 | command |
//! | 4 | 4 | message size, header included |
//! | 8 | 4 | flags: bits 0-3 type (0 command, 1 reply), bit 4 no-reply, bit 5 error |
//! | 12 | 4 | errno (replies with the error bit) |

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use vfio_bindings::bindings::vfio::{
    VFIO_REGION_INFO_CAP_SPARSE_MMAP, VFIO_REGION_INFO_FLAG_CAPS, VFIO_REGION_INFO_FLAG_MMAP,
};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

mod messages;
mod parse;
#[cfg(test)]
mod tests;

pub use messages::*;
pub use parse::{parse_region_caps, parse_version_reply};

/// Errors of the vfio-user client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Socket I/O failed.
    #[error("vfio-user socket I/O failed")]
    Io(#[source] io::Error),
    /// No (complete) reply within the timeout.
    #[error("timed out waiting for a vfio-user reply")]
    Timeout,
    /// The server closed the connection.
    #[error("the vfio-user server closed the connection")]
    Closed,
    /// The server answered with the error bit set.
    #[error("vfio-user command {command} failed on the server with errno {errno}")]
    Remote {
        /// The command that failed.
        command: u16,
        /// The errno from the reply header (may be 0 if the server did not set one).
        errno: i32,
    },
    /// The reply broke the protocol.
    #[error("vfio-user protocol violation (command {command}): {reason}")]
    Protocol {
        /// The command being answered (or 0 if unknown).
        command: u16,
        /// What was wrong.
        reason: String,
    },
}

impl ClientError {
    /// The server's errno if this is a [`ClientError::Remote`].
    pub fn errno(&self) -> Option<i32> {
        match self {
            ClientError::Remote { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

fn proto(command: u16, reason: impl Into<String>) -> ClientError {
    ClientError::Protocol { command, reason: reason.into() }
}

/// Result type of the client.
pub type Result<T> = std::result::Result<T, ClientError>;

/// A received message.
#[derive(Debug)]
pub struct Reply {
    /// The header.
    pub header: Header,
    /// Everything after the header.
    pub payload: Vec<u8>,
    /// File descriptors that came with the message.
    pub fds: Vec<File>,
}

impl Reply {
    /// The errno of an error reply (the error bit set), 0 otherwise.
    pub fn errno(&self) -> i32 {
        if self.header.is_error() {
            self.header.error as i32
        } else {
            0
        }
    }
}

/// What the server answered to VERSION.
#[derive(Debug, Clone)]
pub struct VersionInfo {
    /// Major version (must be 0).
    pub major: u16,
    /// Minor version (at most the proposed 1).
    pub minor: u16,
    /// The raw JSON, without the terminating NUL (empty if the server sent none).
    pub json: String,
    /// Server's `max_msg_fds` (1 if absent).
    pub max_msg_fds: u64,
    /// Server's `max_data_xfer_size` (1 MiB if absent).
    pub max_data_xfer_size: u64,
    /// Server's `pgsizes` (4096 if absent).
    pub pgsizes: u64,
    /// Capability names the server returned that the client did not propose.
    pub unexpected_caps: Vec<String>,
}

/// A region as described by DEVICE_GET_REGION_INFO.
#[derive(Debug)]
pub struct Region {
    /// The reply's `vfio_region_info` (argsz is the full size the server needed).
    pub info: RegionInfoRaw,
    /// Sparse-mmap areas (empty if no such capability).
    pub sparse_areas: Vec<SparseArea>,
    /// Other capabilities seen: (id, version).
    pub other_caps: Vec<(u16, u16)>,
    /// The fd to mmap (present when the region is mappable).
    pub fd: Option<File>,
}

impl Region {
    /// Areas the client may mmap: the sparse areas, or the whole region when it is mappable
    /// without a sparse capability.
    pub fn mappable_areas(&self) -> Vec<SparseArea> {
        if self.info.flags & VFIO_REGION_INFO_FLAG_MMAP == 0 {
            return Vec::new();
        }
        if self.sparse_areas.is_empty() {
            vec![SparseArea { offset: 0, size: self.info.size }]
        } else {
            self.sparse_areas.clone()
        }
    }
}

/// Capabilities the client proposes in VERSION.
#[derive(Debug, Clone, Copy)]
pub struct ClientCaps {
    /// Most fds the client accepts in one message.
    pub max_msg_fds: u32,
    /// Largest data transfer the client accepts.
    pub max_data_xfer_size: u32,
    /// DMA page sizes.
    pub pgsizes: u64,
}

impl Default for ClientCaps {
    fn default() -> Self {
        // QEMU proposes these (VFIO_USER_DEF_MAX_FDS 8, 1 MiB, 4 KiB pages).
        ClientCaps { max_msg_fds: 8, max_data_xfer_size: 1 << 20, pgsizes: 4096 }
    }
}

/// A vfio-user client connection.
pub struct Client {
    stream: UnixStream,
    timeout: Duration,
    next_id: u16,
    max_data_xfer: usize,
    poisoned: bool,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("fd", &self.stream.as_raw_fd())
            .field("next_id", &self.next_id)
            .finish()
    }
}

impl Client {
    /// Connects to the server socket (no message is sent). Replies time out after 5 s.
    pub fn connect(path: &Path) -> Result<Client> {
        let stream = UnixStream::connect(path).map_err(ClientError::Io)?;
        Client::from_stream(stream)
    }

    /// Wraps an already connected stream.
    pub fn from_stream(stream: UnixStream) -> Result<Client> {
        let mut c = Client {
            stream,
            timeout: Duration::from_secs(5),
            next_id: 0,
            max_data_xfer: DEFAULT_MAX_DATA_XFER as usize,
            poisoned: false,
        };
        c.set_timeout(Duration::from_secs(5))?;
        Ok(c)
    }

    /// Sets the read and write timeout of the socket.
    pub fn set_timeout(&mut self, timeout: Duration) -> Result<()> {
        self.timeout = timeout;
        self.stream.set_read_timeout(Some(timeout)).map_err(ClientError::Io)?;
        self.stream.set_write_timeout(Some(timeout)).map_err(ClientError::Io)
    }

    /// The underlying socket (e.g. to shut it down in a test).
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    /// The largest data transfer the server accepts (from VERSION).
    pub fn max_data_xfer(&self) -> usize {
        self.max_data_xfer
    }

    /// Takes the next message id.
    pub fn alloc_msg_id(&mut self) -> u16 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        id
    }

    /// Sends raw bytes (one message or several, or garbage) with `fds` as SCM_RIGHTS.
    pub fn send_raw(&mut self, bytes: &[u8], fds: &[RawFd]) -> Result<()> {
        let sent = if fds.is_empty() {
            if bytes.is_empty() {
                return Ok(());
            }
            (&self.stream).write(bytes).map_err(map_io)?
        } else {
            self.stream
                .send_with_fds(&[bytes], fds)
                .map_err(|e| map_io(io::Error::from_raw_os_error(e.errno())))?
        };
        if sent < bytes.len() {
            (&self.stream).write_all(&bytes[sent..]).map_err(map_io)?;
        }
        Ok(())
    }

    /// Receives one message (any type), with the fds that came with it. Only the size field is
    /// checked (at least a header, at most 64 MiB).
    pub fn recv_reply(&mut self) -> Result<(Header, Vec<u8>, Vec<File>)> {
        let r = self.recv_message()?;
        Ok((r.header, r.payload, r.fds))
    }

    /// Receives one message if one starts arriving within `wait` (at least 1 ms); `None` when
    /// nothing came, e.g. to check that the server has not answered yet. The client's timeout
    /// still bounds the rest of a message that started.
    pub fn try_recv_message(&mut self, wait: Duration) -> Result<Option<Reply>> {
        let timeout = self.timeout;
        self.stream.set_read_timeout(Some(wait.max(Duration::from_millis(1)))).map_err(ClientError::Io)?;
        let mut fds = Vec::new();
        let mut hb = [0u8; HEADER_SIZE];
        let first = if self.poisoned {
            Err(proto(0, "stream desynchronised by an earlier partial message"))
        } else {
            self.read_exact_fds(&mut hb[..1], &mut fds, true)
        };
        self.stream.set_read_timeout(Some(timeout)).map_err(ClientError::Io)?;
        match first {
            Err(ClientError::Timeout) if !self.poisoned => Ok(None),
            Err(e) => Err(e),
            Ok(()) => self.recv_rest(hb, 1, fds).map(Some),
        }
    }

    /// Receives one message as a [`Reply`].
    pub fn recv_message(&mut self) -> Result<Reply> {
        if self.poisoned {
            return Err(proto(0, "stream desynchronised by an earlier partial message"));
        }
        let mut fds = Vec::new();
        let mut hb = [0u8; HEADER_SIZE];
        self.read_exact_fds(&mut hb, &mut fds, true)?;
        self.recv_rest(hb, HEADER_SIZE, fds)
    }

    /// Completes a message whose first `got` header bytes are in `hb`.
    fn recv_rest(&mut self, mut hb: [u8; HEADER_SIZE], got: usize, mut fds: Vec<File>) -> Result<Reply> {
        self.read_exact_fds(&mut hb[got..], &mut fds, false)?;
        let header = Header::decode(&hb).expect("header buffer has the header size");
        if (header.msg_size as usize) < HEADER_SIZE || header.msg_size > MAX_REPLY_SIZE {
            self.poisoned = true;
            return Err(proto(header.command, format!("message size {} out of range", header.msg_size)));
        }
        let mut payload = vec![0u8; header.msg_size as usize - HEADER_SIZE];
        self.read_exact_fds(&mut payload, &mut fds, false)?;
        Ok(Reply { header, payload, fds })
    }

    fn read_exact_fds(&mut self, buf: &mut [u8], fds: &mut Vec<File>, first: bool) -> Result<()> {
        let mut got = 0;
        while got < buf.len() {
            match self.stream.recv_with_fd(&mut buf[got..]) {
                Ok((0, _)) => {
                    if got > 0 || !first {
                        self.poisoned = true;
                    }
                    return Err(ClientError::Closed);
                }
                Ok((n, f)) => {
                    got += n;
                    fds.extend(f);
                }
                Err(e) if e.errno() == libc::EINTR => continue,
                Err(e) if e.errno() == libc::EAGAIN || e.errno() == libc::EWOULDBLOCK => {
                    if got > 0 || !first {
                        self.poisoned = true;
                    }
                    return Err(ClientError::Timeout);
                }
                Err(e) => {
                    self.poisoned = true;
                    return Err(ClientError::Io(io::Error::from_raw_os_error(e.errno())));
                }
            }
        }
        Ok(())
    }

    /// Encodes a command message with a fresh id; returns (id, bytes).
    pub fn encode_command(&mut self, command: u16, extra_flags: u32, payload: &[u8]) -> (u16, Vec<u8>) {
        let id = self.alloc_msg_id();
        let h = Header {
            msg_id: id,
            command,
            msg_size: (HEADER_SIZE + payload.len()) as u32,
            flags: flags::TYPE_COMMAND | extra_flags,
            error: 0,
        };
        let mut v = h.to_bytes();
        v.extend_from_slice(payload);
        (id, v)
    }

    /// Checks that `reply` answers command `command` sent with id `id`; turns the error bit into
    /// [`ClientError::Remote`].
    pub fn check_reply(reply: &Reply, id: u16, command: u16) -> Result<()> {
        let h = &reply.header;
        if h.msg_type() != flags::TYPE_REPLY {
            return Err(proto(
                command,
                format!("expected a reply, got message type {} (command {})", h.msg_type(), h.command),
            ));
        }
        if h.msg_id != id {
            return Err(proto(
                command,
                format!(
                    "reply id {} (command {}) does not match request id {id}; a reply to a NO_REPLY message?",
                    h.msg_id, h.command
                ),
            ));
        }
        if h.command != command {
            return Err(proto(command, format!("reply carries command {}", h.command)));
        }
        if h.flags & !(flags::TYPE_MASK | flags::ERROR) != 0 {
            return Err(proto(command, format!("unexpected reply flags {:#x}", h.flags)));
        }
        if h.is_error() {
            if !reply.payload.is_empty() {
                return Err(proto(
                    command,
                    format!("error reply (errno {}) carries {} payload bytes", h.error, reply.payload.len()),
                ));
            }
            return Err(ClientError::Remote { command, errno: h.error as i32 });
        }
        if h.error != 0 {
            return Err(proto(command, format!("errno {} without the error flag", h.error)));
        }
        Ok(())
    }

    /// Sends a command message (header with a fresh id, `extra_flags` such as
    /// [`flags::NO_REPLY`], then `payload`) with `fds`, without waiting; returns its id.
    pub fn send_command(
        &mut self,
        command: u16,
        extra_flags: u32,
        payload: &[u8],
        fds: &[RawFd],
    ) -> Result<u16> {
        let (id, msg) = self.encode_command(command, extra_flags, payload);
        self.send_raw(&msg, fds)?;
        Ok(id)
    }

    /// Sends a command and returns the reply, error replies included (see [`Reply::errno`]),
    /// with any fds that came with it. The reply is checked as [`Client::check_reply`] does
    /// (type, id, command, flags, no payload beside an error), except that the error bit is
    /// not an error here.
    pub fn call_raw(&mut self, command: u16, payload: &[u8], fds: &[RawFd]) -> Result<Reply> {
        let id = self.send_command(command, 0, payload, fds)?;
        let reply = self.recv_message()?;
        match Self::check_reply(&reply, id, command) {
            Ok(()) | Err(ClientError::Remote { .. }) => Ok(reply),
            Err(e) => Err(e),
        }
    }

    /// Sends a command and returns its validated reply.
    pub fn request(&mut self, command: u16, payload: &[u8], fds: &[RawFd]) -> Result<Reply> {
        let reply = self.call_raw(command, payload, fds)?;
        if reply.header.is_error() {
            return Err(ClientError::Remote { command, errno: reply.errno() });
        }
        if !reply.fds.is_empty() && command != command::DEVICE_GET_REGION_INFO {
            return Err(proto(command, format!("reply carries {} unexpected fds", reply.fds.len())));
        }
        Ok(reply)
    }

    fn request_empty(&mut self, command: u16, payload: &[u8], fds: &[RawFd]) -> Result<()> {
        let r = self.request(command, payload, fds)?;
        if !r.payload.is_empty() {
            return Err(proto(
                command,
                format!("reply has {} payload bytes, expected none", r.payload.len()),
            ));
        }
        Ok(())
    }

    /// VERSION: proposes 0.1 and `caps`; validates and returns the server's answer.
    pub fn version(&mut self, caps: &ClientCaps) -> Result<VersionInfo> {
        let json = format!(
            "{{\"capabilities\":{{\"max_msg_fds\":{},\"max_data_xfer_size\":{},\"pgsizes\":{}}}}}",
            caps.max_msg_fds, caps.max_data_xfer_size, caps.pgsizes
        );
        let mut p = Version { major: 0, minor: 1 }.to_bytes();
        p.extend_from_slice(json.as_bytes());
        p.push(0);
        let r = self.request(command::VERSION, &p, &[])?;
        let info = parse_version_reply(&r.payload)?;
        if info.max_data_xfer_size == 0 {
            return Err(proto(command::VERSION, "max_data_xfer_size is 0"));
        }
        if info.pgsizes & !caps.pgsizes != 0 {
            return Err(proto(
                command::VERSION,
                format!("pgsizes {:#x} not a subset of the proposed {:#x}", info.pgsizes, caps.pgsizes),
            ));
        }
        self.max_data_xfer = info.max_data_xfer_size.min(usize::MAX as u64) as usize;
        Ok(info)
    }

    /// DMA_MAP of `size` bytes at DMA address `address`, backed by `fd` at `offset`.
    pub fn dma_map(
        &mut self,
        flags: u32,
        offset: u64,
        address: u64,
        size: u64,
        fd: Option<RawFd>,
    ) -> Result<()> {
        let m = DmaMap { argsz: DmaMap::SIZE as u32, flags, offset, address, size };
        let fds: Vec<RawFd> = fd.into_iter().collect();
        self.request_empty(command::DMA_MAP, &m.to_bytes(), &fds)
    }

    /// DMA_UNMAP; returns the echoed entry after checking it matches the request.
    pub fn dma_unmap(&mut self, flags: u32, address: u64, size: u64) -> Result<DmaUnmap> {
        let m = DmaUnmap { argsz: DmaUnmap::SIZE as u32, flags, address, size };
        let r = self.request(command::DMA_UNMAP, &m.to_bytes(), &[])?;
        let e = DmaUnmap::decode(&r.payload).ok_or_else(|| {
            proto(
                command::DMA_UNMAP,
                format!("reply payload {} bytes, expected {}", r.payload.len(), DmaUnmap::SIZE),
            )
        })?;
        if r.payload.len() != DmaUnmap::SIZE {
            return Err(proto(
                command::DMA_UNMAP,
                format!("reply payload {} bytes, expected {}", r.payload.len(), DmaUnmap::SIZE),
            ));
        }
        if e.address != address || e.size != size {
            return Err(proto(
                command::DMA_UNMAP,
                format!("reply echoes {:#x}+{:#x}, not the request", e.address, e.size),
            ));
        }
        Ok(e)
    }

    /// DEVICE_GET_INFO.
    pub fn device_info(&mut self) -> Result<DeviceInfo> {
        let q = DeviceInfo { argsz: DeviceInfo::SIZE as u32, ..Default::default() };
        let r = self.request(command::DEVICE_GET_INFO, &q.to_bytes(), &[])?;
        if r.payload.len() != DeviceInfo::SIZE {
            return Err(proto(
                command::DEVICE_GET_INFO,
                format!("reply payload {} bytes, expected 16", r.payload.len()),
            ));
        }
        let info = DeviceInfo::decode(&r.payload).expect("length checked");
        if info.argsz < DeviceInfo::SIZE as u32 {
            return Err(proto(command::DEVICE_GET_INFO, format!("argsz {}", info.argsz)));
        }
        Ok(info)
    }

    /// DEVICE_GET_REGION_INFO, asking first with `argsz` 32 and again with the size the server
    /// says it needs (as QEMU does); parses the capability chain.
    pub fn region_info(&mut self, index: u32) -> Result<Region> {
        let (mut info, mut payload, mut fds) = self.region_info_once(index, REGION_INFO_SIZE as u32)?;
        if info.argsz > REGION_INFO_SIZE as u32 {
            if info.argsz > MAX_REGION_INFO_ARGSZ {
                return Err(proto(
                    command::DEVICE_GET_REGION_INFO,
                    format!("region {index}: argsz {} too large", info.argsz),
                ));
            }
            let needed = info.argsz;
            let (i2, p2, f2) = self.region_info_once(index, needed)?;
            if i2.argsz != needed {
                return Err(proto(
                    command::DEVICE_GET_REGION_INFO,
                    format!("region {index}: argsz changed from {needed} to {}", i2.argsz),
                ));
            }
            if p2.len() != needed as usize {
                return Err(proto(
                    command::DEVICE_GET_REGION_INFO,
                    format!("region {index}: payload {} bytes, argsz {needed}", p2.len()),
                ));
            }
            info = i2;
            payload = p2;
            if !f2.is_empty() || fds.is_empty() {
                fds = f2;
            }
        } else if payload.len() != info.argsz.max(REGION_INFO_SIZE as u32) as usize {
            return Err(proto(
                command::DEVICE_GET_REGION_INFO,
                format!("region {index}: payload {} bytes, argsz {}", payload.len(), info.argsz),
            ));
        }
        let (sparse_areas, other_caps) = parse_region_caps(&info, &payload)?;
        if fds.len() > 1 {
            return Err(proto(
                command::DEVICE_GET_REGION_INFO,
                format!("region {index}: {} fds in the reply", fds.len()),
            ));
        }
        let fd = fds.pop();
        let mappable = info.flags & VFIO_REGION_INFO_FLAG_MMAP != 0;
        if mappable && fd.is_none() {
            return Err(proto(
                command::DEVICE_GET_REGION_INFO,
                format!("region {index}: MMAP flag without a file descriptor"),
            ));
        }
        if !mappable && fd.is_some() {
            return Err(proto(
                command::DEVICE_GET_REGION_INFO,
                format!("region {index}: file descriptor without the MMAP flag"),
            ));
        }
        if !sparse_areas.is_empty() && !mappable {
            return Err(proto(
                command::DEVICE_GET_REGION_INFO,
                format!("region {index}: sparse-mmap capability without the MMAP flag"),
            ));
        }
        Ok(Region { info, sparse_areas, other_caps, fd })
    }

    fn region_info_once(&mut self, index: u32, argsz: u32) -> Result<(RegionInfoRaw, Vec<u8>, Vec<File>)> {
        let q = RegionInfoRaw { argsz, index, ..Default::default() };
        let r = self.request(command::DEVICE_GET_REGION_INFO, &q.to_bytes(), &[])?;
        let info = RegionInfoRaw::decode(&r.payload).ok_or_else(|| {
            proto(
                command::DEVICE_GET_REGION_INFO,
                format!("region {index}: reply payload {} bytes", r.payload.len()),
            )
        })?;
        if info.index != index {
            return Err(proto(
                command::DEVICE_GET_REGION_INFO,
                format!("asked for region {index}, reply describes {}", info.index),
            ));
        }
        if r.payload.len() > argsz.max(REGION_INFO_SIZE as u32) as usize {
            return Err(proto(
                command::DEVICE_GET_REGION_INFO,
                format!(
                    "region {index}: reply payload {} bytes exceeds the requested argsz {argsz}",
                    r.payload.len()
                ),
            ));
        }
        if info.argsz < REGION_INFO_SIZE as u32 {
            return Err(proto(
                command::DEVICE_GET_REGION_INFO,
                format!("region {index}: argsz {} below 32", info.argsz),
            ));
        }
        Ok((info, r.payload, r.fds))
    }

    /// DEVICE_GET_IRQ_INFO for IRQ type `index`.
    pub fn irq_info(&mut self, index: u32) -> Result<IrqInfo> {
        let q = IrqInfo { argsz: IrqInfo::SIZE as u32, index, ..Default::default() };
        let r = self.request(command::DEVICE_GET_IRQ_INFO, &q.to_bytes(), &[])?;
        if r.payload.len() != IrqInfo::SIZE {
            return Err(proto(
                command::DEVICE_GET_IRQ_INFO,
                format!("reply payload {} bytes, expected 16", r.payload.len()),
            ));
        }
        let i = IrqInfo::decode(&r.payload).expect("length checked");
        if i.index != index {
            return Err(proto(
                command::DEVICE_GET_IRQ_INFO,
                format!("asked for irq index {index}, reply describes {}", i.index),
            ));
        }
        Ok(i)
    }

    /// DEVICE_SET_IRQS with optional bool `data` and eventfds.
    pub fn set_irqs(
        &mut self,
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        fds: &[RawFd],
        data: &[u8],
    ) -> Result<()> {
        let s = IrqSet { argsz: (IrqSet::SIZE + data.len()) as u32, flags, index, start, count };
        let mut p = s.to_bytes();
        p.extend_from_slice(data);
        self.request_empty(command::DEVICE_SET_IRQS, &p, fds)
    }

    /// REGION_READ into `buf`, split into `max_data_xfer_size` pieces.
    pub fn region_read(&mut self, region: u32, offset: u64, buf: &mut [u8]) -> Result<()> {
        let step = self.max_data_xfer.max(1);
        let mut done = 0usize;
        while done < buf.len() {
            let n = (buf.len() - done).min(step);
            let off = offset + done as u64;
            let q = RegionAccess { offset: off, region, count: n as u32 };
            let r = self.request(command::REGION_READ, &q.to_bytes(), &[])?;
            let a = RegionAccess::decode(&r.payload).ok_or_else(|| {
                proto(command::REGION_READ, format!("reply payload {} bytes", r.payload.len()))
            })?;
            if a.offset != off || a.region != region || a.count as usize != n {
                return Err(proto(
                    command::REGION_READ,
                    format!(
                        "reply describes region {} {:#x}+{}, asked region {region} {off:#x}+{n}",
                        a.region, a.offset, a.count
                    ),
                ));
            }
            if r.payload.len() != RegionAccess::SIZE + n {
                return Err(proto(
                    command::REGION_READ,
                    format!(
                        "reply carries {} data bytes for count {n}",
                        r.payload.len() - RegionAccess::SIZE
                    ),
                ));
            }
            buf[done..done + n].copy_from_slice(&r.payload[RegionAccess::SIZE..]);
            done += n;
        }
        Ok(())
    }

    /// REGION_WRITE of `data`, waiting for each reply.
    pub fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> Result<()> {
        let step = self.max_data_xfer.max(1);
        let mut done = 0usize;
        while done < data.len() || (data.is_empty() && done == 0) {
            let n = (data.len() - done).min(step);
            let off = offset + done as u64;
            let q = RegionAccess { offset: off, region, count: n as u32 };
            let mut p = q.to_bytes();
            p.extend_from_slice(&data[done..done + n]);
            let r = self.request(command::REGION_WRITE, &p, &[])?;
            if r.payload.len() != RegionAccess::SIZE {
                return Err(proto(
                    command::REGION_WRITE,
                    format!("reply payload {} bytes, expected 16", r.payload.len()),
                ));
            }
            let a = RegionAccess::decode(&r.payload).expect("length checked");
            if a.offset != off || a.region != region || a.count as usize != n {
                return Err(proto(
                    command::REGION_WRITE,
                    format!(
                        "reply describes region {} {:#x}+{}, wrote region {region} {off:#x}+{n}",
                        a.region, a.offset, a.count
                    ),
                ));
            }
            done += n;
            if data.is_empty() {
                break;
            }
        }
        Ok(())
    }

    /// REGION_WRITE with the NO_REPLY flag (a posted write, as QEMU does for BARs).
    pub fn region_write_posted(&mut self, region: u32, offset: u64, data: &[u8]) -> Result<()> {
        let step = self.max_data_xfer.max(1);
        for (i, chunk) in data.chunks(step).enumerate() {
            let q = RegionAccess { offset: offset + (i * step) as u64, region, count: chunk.len() as u32 };
            let mut p = q.to_bytes();
            p.extend_from_slice(chunk);
            let (_, msg) = self.encode_command(command::REGION_WRITE, flags::NO_REPLY, &p);
            self.send_raw(&msg, &[])?;
        }
        Ok(())
    }

    /// DEVICE_RESET.
    pub fn device_reset(&mut self) -> Result<()> {
        self.request_empty(command::DEVICE_RESET, &[], &[])
    }

    /// Reads a little-endian integer of `N` bytes (1, 2, 4 or 8) from a region.
    pub fn read_le(&mut self, region: u32, offset: u64, size: usize) -> Result<u64> {
        let mut b = [0u8; 8];
        self.region_read(region, offset, &mut b[..size])?;
        Ok(u64::from_le_bytes(b))
    }

    /// Writes the low `size` bytes of `value` (little endian) to a region; posted if `posted`.
    pub fn write_le(
        &mut self,
        region: u32,
        offset: u64,
        size: usize,
        value: u64,
        posted: bool,
    ) -> Result<()> {
        let b = value.to_le_bytes();
        if posted {
            self.region_write_posted(region, offset, &b[..size])
        } else {
            self.region_write(region, offset, &b[..size])
        }
    }
}

fn map_io(e: io::Error) -> ClientError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ClientError::Timeout,
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => ClientError::Closed,
        _ => ClientError::Io(e),
    }
}
