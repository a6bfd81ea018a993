//! Unit tests of the client against a hand-driven socket peer.

use super::*;
use std::os::unix::net::UnixStream;

fn reply_bytes(id: u16, cmd: u16, fl: u32, err: u32, payload: &[u8]) -> Vec<u8> {
    let mut v =
        Header { msg_id: id, command: cmd, msg_size: (16 + payload.len()) as u32, flags: fl, error: err }
            .to_bytes();
    v.extend_from_slice(payload);
    v
}

fn pair() -> (Client, UnixStream) {
    let (a, b) = UnixStream::pair().unwrap();
    let mut c = Client::from_stream(a).unwrap();
    c.set_timeout(Duration::from_millis(300)).unwrap();
    (c, b)
}

#[test]
fn header_layout() {
    let h = Header { msg_id: 1, command: 2, msg_size: 3, flags: 4, error: 5 };
    assert_eq!(h.to_bytes(), vec![1, 0, 2, 0, 3, 0, 0, 0, 4, 0, 0, 0, 5, 0, 0, 0]);
    assert_eq!(DmaMap::SIZE, 32);
    assert_eq!(DmaUnmap::SIZE, 24);
    assert_eq!(RegionInfoRaw::SIZE, 32);
    assert_eq!(IrqSet::SIZE, 20);
    assert_eq!(RegionAccess::SIZE, 16);
    assert_eq!((Version::SIZE, SparseMmapHead::SIZE, CapHeader::SIZE), (4, 8, 8));
}

#[test]
fn call_raw_returns_error_replies_and_their_fds() {
    let (mut c, mut s) = pair();
    s.write_all(&reply_bytes(0, command::DMA_MAP, flags::TYPE_REPLY | flags::ERROR, 17, &[])).unwrap();
    let r = c.call_raw(command::DMA_MAP, &[0u8; 32], &[]).unwrap();
    assert_eq!((r.errno(), r.header.msg_id), (17, 0));
    // The request went out framed, with a fresh id.
    let mut b = [0u8; 48];
    std::io::Read::read_exact(&mut s, &mut b).unwrap();
    let h = Header::decode(&b).unwrap();
    assert_eq!((h.msg_id, h.command, h.msg_size, h.flags), (0, command::DMA_MAP, 48, 0));
    // A reply for another id is still a protocol error.
    s.write_all(&reply_bytes(9, command::DMA_MAP, flags::TYPE_REPLY, 0, &[])).unwrap();
    assert!(matches!(c.call_raw(command::DMA_MAP, &[], &[]), Err(ClientError::Protocol { .. })));
    // fds of a reply are kept.
    let f = tempfile::tempfile().unwrap();
    let ok = reply_bytes(2, command::DEVICE_GET_INFO, flags::TYPE_REPLY, 0, &[1, 2, 3, 4]);
    s.send_with_fds(&[&ok[..]], &[f.as_raw_fd()]).unwrap();
    let r = c.call_raw(command::DEVICE_GET_INFO, &[], &[]).unwrap();
    assert_eq!((r.errno(), r.payload.as_slice(), r.fds.len()), (0, &[1u8, 2, 3, 4][..], 1));
}

#[test]
fn try_recv_message_waits_only_as_told() {
    let (mut c, mut s) = pair();
    let id = c.send_command(command::REGION_WRITE, flags::NO_REPLY, &[7], &[]).unwrap();
    let mut b = [0u8; 17];
    std::io::Read::read_exact(&mut s, &mut b).unwrap();
    assert_eq!(Header::decode(&b).unwrap().flags, flags::NO_REPLY);
    let t0 = std::time::Instant::now();
    assert!(c.try_recv_message(Duration::from_millis(20)).unwrap().is_none());
    assert!(t0.elapsed() < Duration::from_millis(250), "waited for the client timeout");
    s.write_all(&reply_bytes(id, command::REGION_WRITE, flags::TYPE_REPLY, 0, &[5; 3])).unwrap();
    let r = c.try_recv_message(Duration::from_millis(20)).unwrap().expect("a message was there");
    assert_eq!((r.header.msg_id, r.payload.as_slice()), (id, &[5u8; 3][..]));
    // The normal timeout is back.
    assert!(matches!(c.device_reset(), Err(ClientError::Timeout)));
}

#[test]
fn error_reply_becomes_remote() {
    let (mut c, mut s) = pair();
    s.write_all(&reply_bytes(0, command::DEVICE_RESET, flags::TYPE_REPLY | flags::ERROR, 22, &[])).unwrap();
    match c.device_reset() {
        Err(ClientError::Remote { command, errno }) => {
            assert_eq!(command, command::DEVICE_RESET);
            assert_eq!(errno, 22);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn wrong_id_and_type_are_protocol_errors() {
    let (mut c, mut s) = pair();
    s.write_all(&reply_bytes(7, command::DEVICE_RESET, flags::TYPE_REPLY, 0, &[])).unwrap();
    assert!(matches!(c.device_reset(), Err(ClientError::Protocol { .. })));
    s.write_all(&reply_bytes(1, command::DEVICE_RESET, flags::TYPE_COMMAND, 0, &[])).unwrap();
    assert!(matches!(c.device_reset(), Err(ClientError::Protocol { .. })));
    s.write_all(&reply_bytes(2, command::DEVICE_RESET, flags::TYPE_REPLY, 5, &[])).unwrap();
    assert!(matches!(c.device_reset(), Err(ClientError::Protocol { .. })));
    s.write_all(&reply_bytes(3, command::DEVICE_RESET, flags::TYPE_REPLY | flags::ERROR, 5, &[1])).unwrap();
    assert!(matches!(c.device_reset(), Err(ClientError::Protocol { .. })));
    s.write_all(&reply_bytes(4, command::DEVICE_RESET, flags::TYPE_REPLY, 0, &[1])).unwrap();
    assert!(matches!(c.device_reset(), Err(ClientError::Protocol { .. })));
}

#[test]
fn timeout_does_not_hang() {
    let (mut c, _s) = pair();
    assert!(matches!(c.device_reset(), Err(ClientError::Timeout)));
}

#[test]
fn closed_socket() {
    let (mut c, s) = pair();
    drop(s);
    let r = c.device_reset();
    assert!(matches!(r, Err(ClientError::Closed) | Err(ClientError::Io(_))), "{r:?}");
}

#[test]
fn region_read_checks_echo_and_length() {
    let (mut c, mut s) = pair();
    let mut p = RegionAccess { offset: 0x10, region: 7, count: 2 }.to_bytes();
    p.extend_from_slice(&[0xf4, 0x1a]);
    s.write_all(&reply_bytes(0, command::REGION_READ, flags::TYPE_REPLY, 0, &p)).unwrap();
    let mut b = [0u8; 2];
    c.region_read(7, 0x10, &mut b).unwrap();
    assert_eq!(b, [0xf4, 0x1a]);
    // Wrong count echoed.
    let mut p = RegionAccess { offset: 0x10, region: 7, count: 4 }.to_bytes();
    p.extend_from_slice(&[0, 0, 0, 0]);
    s.write_all(&reply_bytes(1, command::REGION_READ, flags::TYPE_REPLY, 0, &p)).unwrap();
    assert!(matches!(c.region_read(7, 0x10, &mut b), Err(ClientError::Protocol { .. })));
}

#[test]
fn version_parsing() {
    let mut p = vec![0, 0, 1, 0];
    p.extend_from_slice(
        br#"{"capabilities":{"max_msg_fds":16,"max_data_xfer_size":4096,"pgsizes":4096,"twin_socket":{}}}"#,
    );
    p.push(0);
    let v = parse_version_reply(&p).unwrap();
    assert_eq!(v.max_msg_fds, 16);
    assert_eq!(v.max_data_xfer_size, 4096);
    assert_eq!(v.unexpected_caps, vec!["twin_socket".to_string()]);
    assert!(parse_version_reply(&[1, 0, 1, 0]).is_err());
    assert!(parse_version_reply(&[0, 0, 2, 0]).is_err());
    assert!(parse_version_reply(&[0, 0, 1, 0, b'{', b'}']).is_err());
    assert!(parse_version_reply(&[0, 0, 1, 0, b'x', 0]).is_err());
    let v = parse_version_reply(&[0, 0, 1, 0]).unwrap();
    assert_eq!(v.max_data_xfer_size, 1 << 20);
}

#[test]
fn region_caps_parsing() {
    let info = RegionInfoRaw {
        argsz: 32 + 8 + 8 + 16,
        flags: VFIO_REGION_INFO_FLAG_CAPS | VFIO_REGION_INFO_FLAG_MMAP,
        index: 4,
        cap_offset: 32,
        size: 0x4000,
        offset: 0,
    };
    let mut p = info.to_bytes();
    CapHeader { id: 1, version: 1, next: 0 }.encode_into(&mut p);
    p.extend_from_slice(&1u32.to_le_bytes());
    p.extend_from_slice(&0u32.to_le_bytes());
    SparseArea { offset: 0x3000, size: 0x1000 }.encode_into(&mut p);
    let (s, o) = parse_region_caps(&info, &p).unwrap();
    assert_eq!(s, vec![SparseArea { offset: 0x3000, size: 0x1000 }]);
    assert!(o.is_empty());
    // Area beyond the region.
    let mut bad = p.clone();
    let n = bad.len();
    bad[n - 16..n - 8].copy_from_slice(&0x3800u64.to_le_bytes());
    assert!(parse_region_caps(&info, &bad).is_err());
    // Self-loop.
    let mut looped = p.clone();
    looped[36..40].copy_from_slice(&32u32.to_le_bytes());
    assert!(parse_region_caps(&info, &looped).is_err());
}

#[test]
fn send_raw_passes_fds() {
    let (mut c, s) = pair();
    let f = tempfile::tempfile().unwrap();
    c.send_raw(b"0123456789abcdef", &[f.as_raw_fd()]).unwrap();
    let mut buf = [0u8; 16];
    let (n, file) = s.recv_with_fd(&mut buf).unwrap();
    assert_eq!(n, 16);
    assert!(file.is_some());
}
