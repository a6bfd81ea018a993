//! vfio-user wire format: the message header, the fixed request/reply structs, and the socket
//! calls that move bytes and file descriptors.
//!
//! This is one of the two kinds of module allowed to hold `unsafe` (byte-casting of wire structs
//! and the `recvmsg`/`sendmsg` calls that carry `SCM_RIGHTS`). Everything is host-endian, as the
//! protocol specifies (docs/interop/vfio-user.rst in QEMU).
//!
//! **A second implementation on purpose.** The host driver model encodes the same messages with
//! its own code (`tools/src/vfio_user/messages.rs`, written from the specification without this
//! module), and the conformance tests drive this server through that client: a layout mistake on
//! either side fails a test instead of cancelling out. Keep them apart; settle a mismatch against
//! the specification.
//!
//! ```text
//! header (16 bytes): u16 msg_id | u16 command | u32 msg_size (incl. header) | u32 flags | u32 error
//! flags: bits 0-3 type (0 command, 1 reply), bit 4 NO_REPLY, bit 5 ERROR
//! ```

use std::fs::File;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;

use vm_memory::ByteValued;

/// Size of the message header.
pub const HEADER_SIZE: usize = size_of::<Header>();
/// Type bits of `flags`: a command.
pub const FLAG_COMMAND: u32 = 0;
/// Type bits of `flags`: a reply.
pub const FLAG_REPLY: u32 = 1;
/// Mask of the type bits.
pub const FLAG_TYPE_MASK: u32 = 0xf;
/// The sender wants no reply.
pub const FLAG_NO_REPLY: u32 = 1 << 4;
/// The reply reports an error in `error`.
pub const FLAG_ERROR: u32 = 1 << 5;

/// Most file descriptors one message may carry (also what we announce as `max_msg_fds`).
pub const MAX_MSG_FDS: usize = 16;

/// vfio-user command numbers.
#[allow(missing_docs)]
pub mod cmd {
    pub const VERSION: u16 = 1;
    pub const DMA_MAP: u16 = 2;
    pub const DMA_UNMAP: u16 = 3;
    pub const DEVICE_GET_INFO: u16 = 4;
    pub const DEVICE_GET_REGION_INFO: u16 = 5;
    pub const DEVICE_GET_REGION_IO_FDS: u16 = 6;
    pub const DEVICE_GET_IRQ_INFO: u16 = 7;
    pub const DEVICE_SET_IRQS: u16 = 8;
    pub const REGION_READ: u16 = 9;
    pub const REGION_WRITE: u16 = 10;
    pub const DMA_READ: u16 = 11;
    pub const DMA_WRITE: u16 = 12;
    pub const DEVICE_RESET: u16 = 13;
    pub const REGION_WRITE_MULTI: u16 = 15;
    pub const DEVICE_FEATURE: u16 = 16;

    /// The command's name, as the protocol specification spells it (for logs).
    pub fn name(command: u16) -> &'static str {
        match command {
            VERSION => "VERSION",
            DMA_MAP => "DMA_MAP",
            DMA_UNMAP => "DMA_UNMAP",
            DEVICE_GET_INFO => "DEVICE_GET_INFO",
            DEVICE_GET_REGION_INFO => "DEVICE_GET_REGION_INFO",
            DEVICE_GET_REGION_IO_FDS => "DEVICE_GET_REGION_IO_FDS",
            DEVICE_GET_IRQ_INFO => "DEVICE_GET_IRQ_INFO",
            DEVICE_SET_IRQS => "DEVICE_SET_IRQS",
            REGION_READ => "REGION_READ",
            REGION_WRITE => "REGION_WRITE",
            DMA_READ => "DMA_READ",
            DMA_WRITE => "DMA_WRITE",
            DEVICE_RESET => "DEVICE_RESET",
            REGION_WRITE_MULTI => "REGION_WRITE_MULTI",
            DEVICE_FEATURE => "DEVICE_FEATURE",
            _ => "unknown command",
        }
    }
}

/// The 16-byte header in front of every message.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Chosen by the sender, echoed in the reply.
    pub msg_id: u16,
    /// Command number ([`cmd`]).
    pub command: u16,
    /// Size of the whole message, header included.
    pub msg_size: u32,
    /// Type, NO_REPLY and ERROR bits.
    pub flags: u32,
    /// errno of an error reply.
    pub error: u32,
}

/// VERSION payload head; NUL-terminated JSON follows.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Version {
    /// Protocol major version (0).
    pub major: u16,
    /// Protocol minor version.
    pub minor: u16,
}

/// DMA_MAP request.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DmaMap {
    /// Size of this struct (32).
    pub argsz: u32,
    /// Bit 0 readable, bit 1 writeable.
    pub flags: u32,
    /// Offset into the passed file descriptor.
    pub offset: u64,
    /// DMA (guest physical) address.
    pub address: u64,
    /// Length of the region.
    pub size: u64,
}

/// DMA_UNMAP request and reply.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DmaUnmap {
    /// Maximum reply payload size.
    pub argsz: u32,
    /// `VFIO_DMA_UNMAP_FLAG_*`.
    pub flags: u32,
    /// DMA address.
    pub address: u64,
    /// Length.
    pub size: u64,
}

/// DEVICE_GET_INFO request and reply.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DeviceInfo {
    /// Request: maximum reply size; reply: size of the full reply.
    pub argsz: u32,
    /// `VFIO_DEVICE_FLAGS_*`.
    pub flags: u32,
    /// Number of regions.
    pub num_regions: u32,
    /// Number of IRQ types.
    pub num_irqs: u32,
}

/// DEVICE_GET_REGION_INFO request and reply (`struct vfio_region_info`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RegionInfo {
    /// Request: maximum reply size; reply: size needed for the full reply.
    pub argsz: u32,
    /// `VFIO_REGION_INFO_FLAG_*`.
    pub flags: u32,
    /// Region index.
    pub index: u32,
    /// Offset of the first capability from the start of this struct, 0 if none.
    pub cap_offset: u32,
    /// Region size.
    pub size: u64,
    /// mmap offset in the passed file descriptor.
    pub offset: u64,
}

/// Header of the sparse-mmap region capability, followed by `nr_areas` [`SparseArea`]s.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SparseMmapCap {
    /// `VFIO_REGION_INFO_CAP_SPARSE_MMAP`.
    pub id: u16,
    /// Capability version (1).
    pub version: u16,
    /// Offset of the next capability, 0 if none.
    pub next: u32,
    /// Number of areas that follow.
    pub nr_areas: u32,
    /// Reserved.
    pub reserved: u32,
}

/// One mmappable area of a region.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SparseArea {
    /// Offset in the region.
    pub offset: u64,
    /// Size of the area.
    pub size: u64,
}

/// DEVICE_GET_IRQ_INFO request and reply.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IrqInfo {
    /// Request: maximum reply size; reply: size of the full reply.
    pub argsz: u32,
    /// `VFIO_IRQ_INFO_*`.
    pub flags: u32,
    /// IRQ type index.
    pub index: u32,
    /// Number of vectors.
    pub count: u32,
}

/// DEVICE_SET_IRQS request (`struct vfio_irq_set`), optionally followed by a bool array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IrqSet {
    /// Size of the request payload.
    pub argsz: u32,
    /// `VFIO_IRQ_SET_DATA_*` | `VFIO_IRQ_SET_ACTION_*`.
    pub flags: u32,
    /// IRQ type index.
    pub index: u32,
    /// First vector.
    pub start: u32,
    /// Number of vectors.
    pub count: u32,
}

/// REGION_READ / REGION_WRITE head; data follows for writes and read replies.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RegionAccess {
    /// Offset in the region.
    pub offset: u64,
    /// Region index.
    pub region: u32,
    /// Number of bytes.
    pub count: u32,
}

// SAFETY: all of these are `repr(C)` structs of plain integers whose sizes are multiples of their
// alignment (checked by the size assertions below), so they have no padding and every bit pattern
// is a valid value.
unsafe impl ByteValued for Header {}
// SAFETY: as above: repr(C), two u16, no padding, any bit pattern valid.
unsafe impl ByteValued for Version {}
// SAFETY: as above: repr(C), u32 u32 u64 u64 u64, no padding.
unsafe impl ByteValued for DmaMap {}
// SAFETY: as above: repr(C), u32 u32 u64 u64, no padding.
unsafe impl ByteValued for DmaUnmap {}
// SAFETY: as above: repr(C), four u32, no padding.
unsafe impl ByteValued for DeviceInfo {}
// SAFETY: as above: repr(C), four u32 then two u64, no padding.
unsafe impl ByteValued for RegionInfo {}
// SAFETY: as above: repr(C), u16 u16 u32 u32 u32, no padding.
unsafe impl ByteValued for SparseMmapCap {}
// SAFETY: as above: repr(C), two u64, no padding.
unsafe impl ByteValued for SparseArea {}
// SAFETY: as above: repr(C), four u32, no padding.
unsafe impl ByteValued for IrqInfo {}
// SAFETY: as above: repr(C), five u32, no padding.
unsafe impl ByteValued for IrqSet {}
// SAFETY: as above: repr(C), u64 u32 u32, no padding.
unsafe impl ByteValued for RegionAccess {}

const _: () = {
    assert!(size_of::<Header>() == 16);
    assert!(size_of::<Version>() == 4);
    assert!(size_of::<DmaMap>() == 32);
    assert!(size_of::<DmaUnmap>() == 24);
    assert!(size_of::<DeviceInfo>() == 16);
    assert!(size_of::<RegionInfo>() == 32);
    assert!(size_of::<SparseMmapCap>() == 16);
    assert!(size_of::<SparseArea>() == 16);
    assert!(size_of::<IrqInfo>() == 16);
    assert!(size_of::<IrqSet>() == 20);
    assert!(size_of::<RegionAccess>() == 16);
};

/// Reads a `T` from the front of `bytes`, if there are enough of them.
pub fn read_obj<T: ByteValued + Default>(bytes: &[u8]) -> Option<T> {
    bytes.get(..size_of::<T>()).and_then(T::from_slice).copied().or_else(|| {
        // `from_slice` also insists on alignment; copy through an aligned value instead.
        let src = bytes.get(..size_of::<T>())?;
        let mut v = T::default();
        v.as_mut_slice().copy_from_slice(src);
        Some(v)
    })
}

/// Receives up to `buf.len()` bytes and any file descriptors sent with them.
///
/// Returns `Ok(0)` at end of stream. Descriptors are returned as owned `File`s, opened with
/// `CLOEXEC`. If the sender passed more descriptors than [`MAX_MSG_FDS`] the kernel truncates the
/// control message and closes the excess; that is reported as `truncated_fds`.
pub fn recv_with_fds(sock: &UnixStream, buf: &mut [u8], fds: &mut Vec<File>) -> io::Result<RecvResult> {
    // Room for MAX_MSG_FDS descriptors in one SCM_RIGHTS message, rounded up generously.
    let mut cmsg_buf = [0u64; (64 + MAX_MSG_FDS * size_of::<RawFd>()) / 8];
    recv_into(sock, buf, fds, &mut cmsg_buf)
}

/// Most descriptors one message of [`send_group`] carries (the kernel's `SCM_MAX_FD`).
pub const MAX_GROUP_FDS: usize = 253;

/// As [`recv_with_fds`], with room for [`MAX_GROUP_FDS`] descriptors: for a channel between
/// processes of ours that pass many (a live update), not for a vfio-user client.
pub fn recv_group(sock: &UnixStream, buf: &mut [u8], fds: &mut Vec<File>) -> io::Result<RecvResult> {
    let mut cmsg_buf = [0u64; (64 + MAX_GROUP_FDS * size_of::<RawFd>()) / 8];
    recv_into(sock, buf, fds, &mut cmsg_buf)
}

/// As [`send_with_fds`], with up to [`MAX_GROUP_FDS`] descriptors (see [`recv_group`]).
pub fn send_group(sock: &UnixStream, bufs: &[&[u8]], fds: &[RawFd]) -> io::Result<usize> {
    if fds.len() > MAX_GROUP_FDS {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut cmsg_buf = [0u64; (64 + MAX_GROUP_FDS * size_of::<RawFd>()) / 8];
    send_from(sock, bufs, fds, &mut cmsg_buf)
}

/// One `recvmsg` into `buf`, its descriptors into `fds`, with `cmsg_buf` as the control
/// buffer (its size bounds the descriptors taken; more are reported as `truncated_fds`).
fn recv_into(
    sock: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<File>,
    cmsg_buf: &mut [u64],
) -> io::Result<RecvResult> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: msghdr is a plain C struct for which all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg_buf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(cmsg_buf) as _;
    // SAFETY: `msg` points at `iov` (describing `buf`, valid for writes of its length) and at
    // `cmsg_buf` (valid for writes of `msg_controllen` bytes); both outlive the call.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `msg` was filled in by a successful recvmsg; CMSG_FIRSTHDR only reads its fields.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cmsg.is_null() {
        // SAFETY: `cmsg` is non-null and was produced by CMSG_FIRSTHDR/CMSG_NXTHDR over our own
        // control buffer, so it points at a complete cmsghdr inside `cmsg_buf`.
        let hdr = unsafe { &*cmsg };
        if hdr.cmsg_level == libc::SOL_SOCKET && hdr.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_LEN(0) is a pure size computation.
            let head = unsafe { libc::CMSG_LEN(0) } as usize;
            let count = (hdr.cmsg_len as usize).saturating_sub(head) / size_of::<RawFd>();
            // SAFETY: for an SCM_RIGHTS message CMSG_DATA points at `count` file descriptors
            // inside the control buffer (the kernel wrote cmsg_len bytes).
            let data = unsafe { libc::CMSG_DATA(cmsg) } as *const RawFd;
            for i in 0..count {
                // SAFETY: `i < count`, so the read is inside the descriptor array; it may be
                // unaligned within the byte buffer, hence read_unaligned.
                let fd = unsafe { data.add(i).read_unaligned() };
                // SAFETY: the kernel just installed `fd` in our table for us; nobody else owns it.
                fds.push(unsafe { File::from_raw_fd(fd) });
            }
        }
        // SAFETY: `msg` and `cmsg` are valid as above; CMSG_NXTHDR returns null at the end.
        cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
    }
    Ok(RecvResult { bytes: n as usize, truncated_fds: msg.msg_flags & libc::MSG_CTRUNC != 0 })
}

/// What one [`recv_with_fds`] call got.
#[derive(Debug, Clone, Copy)]
pub struct RecvResult {
    /// Bytes received (0 at end of stream).
    pub bytes: usize,
    /// The sender passed more descriptors than we accept.
    pub truncated_fds: bool,
}

/// Sends `bufs` as one message, with `fds` attached to its first byte.
pub fn send_with_fds(sock: &UnixStream, bufs: &[&[u8]], fds: &[RawFd]) -> io::Result<usize> {
    if fds.len() > MAX_MSG_FDS {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut cmsg_buf = [0u64; (64 + MAX_MSG_FDS * size_of::<RawFd>()) / 8];
    send_from(sock, bufs, fds, &mut cmsg_buf)
}

/// One `sendmsg` of `bufs` with `fds`, built in `cmsg_buf` (room for `fds`, checked by the
/// callers).
fn send_from(sock: &UnixStream, bufs: &[&[u8]], fds: &[RawFd], cmsg_buf: &mut [u64]) -> io::Result<usize> {
    let mut iovs: heapless::Vec<libc::iovec, 4> = heapless::Vec::new();
    for b in bufs {
        iovs.push(libc::iovec { iov_base: b.as_ptr() as *mut _, iov_len: b.len() })
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    }
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) } as usize;
    if !fds.is_empty() && space > std::mem::size_of_val(cmsg_buf) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: msghdr is a plain C struct for which all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iovs.as_mut_ptr();
    msg.msg_iovlen = iovs.len() as _;
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds);
        msg.msg_control = cmsg_buf.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE is a pure size computation.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(bytes as u32) } as _;
        // SAFETY: msg_control points at a buffer of at least msg_controllen bytes.
        let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
        // SAFETY: `cmsg` points at the start of `cmsg_buf`, large enough for one header plus
        // `fds` (checked above); we write the header fields and then the descriptor array.
        unsafe {
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(bytes as u32) as _;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg) as *mut RawFd, fds.len());
        }
    }
    // SAFETY: every iovec describes a live borrowed buffer that is only read; the control buffer
    // is valid as set up above; all outlive the call.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn header_roundtrip() {
        let h = Header { msg_id: 7, command: cmd::REGION_READ, msg_size: 32, flags: FLAG_NO_REPLY, error: 0 };
        let bytes = h.as_slice().to_vec();
        assert_eq!(bytes.len(), HEADER_SIZE);
        assert_eq!(read_obj::<Header>(&bytes), Some(h));
        assert_eq!(read_obj::<Header>(&bytes[..15]), None);
        // Unaligned source.
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&bytes);
        assert_eq!(read_obj::<Header>(&shifted[1..]), Some(h));
    }

    #[test]
    fn fds_travel_with_bytes() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"hello").unwrap();
        let n = send_with_fds(&a, &[b"abc", b"de"], &[f.as_raw_fd(), f.as_raw_fd()]).unwrap();
        assert_eq!(n, 5);
        let mut buf = [0u8; 16];
        let mut fds = Vec::new();
        let r = recv_with_fds(&b, &mut buf, &mut fds).unwrap();
        assert_eq!(&buf[..r.bytes], b"abcde");
        assert_eq!(fds.len(), 2);
        assert!(!r.truncated_fds);
        assert_eq!(fds[0].metadata().unwrap().len(), 5);
    }
}
