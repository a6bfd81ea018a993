//! Framing and negotiation: VERSION, commands before it, headers whose size is wrong, payloads
//! that disagree with their size fields, unknown commands, oversized messages, posted writes,
//! garbage, a second client.

use std::time::Duration;

use virtiofs_tools::vfio_user::{
    command as cmd, flags, Client, ClientError, DeviceInfo, DmaMap, Header, RegionAccess, RegionInfoRaw,
    Version, HEADER_SIZE,
};

use crate::common::{errno, noise, Dev, ReplyOk};

/// VERSION with `json` (NUL added) after major 0, minor 1.
fn version_payload(json: &[u8]) -> Vec<u8> {
    let mut p = Version { major: 0, minor: 1 }.to_bytes();
    p.extend_from_slice(json);
    p.push(0);
    p
}

#[test]
fn version_negotiates_capabilities() {
    let dev = Dev::start();
    let mut c = dev.connect();
    // Raw first, to see the bytes; the typed call checks the same reply shape again below.
    let r = c
        .call(
            cmd::VERSION,
            &version_payload(
                br#"{"capabilities":{"max_msg_fds":16,"max_data_xfer_size":1048576,"pgsizes":4096}}"#,
            ),
        )
        .ok();
    let v = Version::decode(&r.payload).unwrap();
    assert_eq!((v.major, v.minor), (0, 1));
    assert_eq!(*r.payload.last().unwrap(), 0, "JSON is NUL-terminated");
    let json = std::str::from_utf8(&r.payload[Version::SIZE..r.payload.len() - 1]).unwrap();
    let value: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(value["capabilities"]["max_data_xfer_size"], 1048576);
    assert_eq!(value["capabilities"]["max_msg_fds"], 16);
    assert!(value["capabilities"].get("max_dma_maps").is_none(), "only capabilities the client proposed");
    // A second VERSION on the same connection is refused.
    assert_eq!(errno(c.call(cmd::VERSION, &Version { major: 0, minor: 1 }.to_bytes())), libc::EINVAL);
    c.still_serves();
    // The driver model's typed VERSION on a fresh connection agrees.
    drop(c);
    let mut c = dev.connect();
    let info = c.version();
    assert_eq!((info.major, info.minor, info.max_msg_fds, info.max_data_xfer_size), (0, 1, 16, 1 << 20));
    assert_eq!(info.pgsizes, 4096);
    assert!(info.unexpected_caps.is_empty(), "only capabilities the client proposed: {info:?}");
    c.still_serves();
}

#[test]
fn version_without_json_is_accepted() {
    let dev = Dev::start();
    let mut c = dev.connect();
    c.call(cmd::VERSION, &Version { major: 0, minor: 0 }.to_bytes()).ok();
    c.still_serves();
}

#[test]
fn malformed_version_gets_einval_and_retry_works() {
    let dev = Dev::start();
    let mut c = dev.connect();
    for bad in
        [&b"{not json"[..], b"{\"capabilities\":{\"max_msg_fds\":\"x\"}}", b"[1,2]", b"{\"capabilities\":3}"]
    {
        assert_eq!(
            errno(c.call(cmd::VERSION, &version_payload(bad))),
            libc::EINVAL,
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    // Not NUL-terminated, and a payload too short for major/minor.
    let mut p = Version { major: 0, minor: 1 }.to_bytes();
    p.extend_from_slice(b"{}");
    assert_eq!(errno(c.call(cmd::VERSION, &p)), libc::EINVAL);
    assert_eq!(errno(c.call(cmd::VERSION, &[0])), libc::EINVAL);
    assert_eq!(errno(c.call(cmd::VERSION, &Version { major: 1, minor: 0 }.to_bytes())), libc::ENOTSUP);
    c.version();
    c.still_serves();
}

#[test]
fn commands_before_version_are_refused() {
    let dev = Dev::start();
    let mut c = dev.connect();
    let r = c.call(cmd::DEVICE_GET_INFO, &DeviceInfo { argsz: 16, ..Default::default() }.to_bytes());
    assert_eq!(errno(r), libc::EINVAL);
    c.version();
    c.still_serves();
}

#[test]
fn short_header_size_gets_einval() {
    let dev = Dev::start();
    let mut c = dev.client();
    let h = Header { msg_id: 77, command: cmd::DEVICE_GET_INFO, msg_size: 8, flags: 0, error: 0 };
    c.send_raw(&h.to_bytes());
    let r = c.recv();
    assert_eq!((r.header.msg_id, errno(&r)), (77, libc::EINVAL));
    c.still_serves();
}

#[test]
fn truncated_header_then_disconnect_and_reconnect() {
    let dev = Dev::start();
    {
        let mut c = dev.client();
        let (_, b) = c.client.encode_command(
            cmd::DEVICE_GET_INFO,
            0,
            &DeviceInfo { argsz: 16, ..Default::default() }.to_bytes(),
        );
        assert!(b.len() > HEADER_SIZE);
        c.send_raw(&b[..10]);
    } // dropped mid-request
    let mut c = dev.client();
    c.still_serves();
}

#[test]
fn size_field_disagreeing_with_payload() {
    let dev = Dev::start();
    let mut c = dev.client();
    // REGION_WRITE whose count says 8 but carries 4 bytes.
    let mut p = RegionAccess { offset: 0x3c, region: 7, count: 8 }.to_bytes();
    p.extend_from_slice(&[1, 2, 3, 4]);
    assert_eq!(errno(c.call(cmd::REGION_WRITE, &p)), libc::EINVAL);
    // DMA_MAP with a short payload, and with argsz wrong.
    assert_eq!(errno(c.call(cmd::DMA_MAP, &[0u8; 24])), libc::EINVAL);
    let m = DmaMap { argsz: 16, flags: 3, offset: 0, address: 0, size: 4096 };
    assert_eq!(errno(c.call(cmd::DMA_MAP, &m.to_bytes())), libc::EINVAL);
    // REGION_READ with trailing garbage.
    let mut p = RegionAccess { offset: 0, region: 7, count: 4 }.to_bytes();
    p.push(9);
    assert_eq!(errno(c.call(cmd::REGION_READ, &p)), libc::EINVAL);
    // GET_REGION_INFO with argsz smaller than the struct.
    let ri = RegionInfoRaw { argsz: 8, index: 7, ..Default::default() };
    assert_eq!(errno(c.call(cmd::DEVICE_GET_REGION_INFO, &ri.to_bytes())), libc::EINVAL);
    c.still_serves();
}

#[test]
fn unknown_and_unsupported_commands() {
    let dev = Dev::start();
    let mut c = dev.client();
    assert_eq!(errno(c.call(99, &[1, 2, 3])), libc::ENOSYS);
    assert_eq!(errno(c.call(cmd::REGION_WRITE_MULTI, &[0u8; 8])), libc::ENOTSUP);
    assert_eq!(errno(c.call(cmd::DEVICE_RESET, &[0u8; 4])), libc::EINVAL);
    c.still_serves();
}

#[test]
fn oversized_message_is_drained() {
    let dev = Dev::start();
    let mut c = dev.client();
    let data = vec![0xa5u8; 2 << 20];
    let r = c.region_write(4, 0, &data);
    assert_eq!(errno(r), libc::E2BIG);
    c.still_serves();
    assert_eq!(c.read32(7, 0), 0x105a_1af4);
}

#[test]
fn posted_writes_get_no_reply_even_on_error() {
    let dev = Dev::start();
    let mut c = dev.client();
    // The driver model's posted write (as QEMU sends BAR writes), then a bad one by hand.
    c.client.region_write_posted(7, 0x3c, &[0x42]).unwrap();
    let mut bad = RegionAccess { offset: 0, region: 3, count: 1 }.to_bytes();
    bad.push(1);
    c.send(cmd::REGION_WRITE, flags::NO_REPLY, &bad, &[]);
    // The next reply is for this read, not for the posted writes.
    assert_eq!(c.read32(7, 0x3c) & 0xff, 0x42);
    assert!(c.client.try_recv_message(Duration::from_millis(50)).unwrap().is_none(), "no late reply");
}

#[test]
fn garbage_never_kills_the_server() {
    let dev = Dev::start();
    for seed in 1..=8u64 {
        // Unframed noise after a valid VERSION (the server may close the connection meanwhile).
        let mut c = dev.client();
        let _ = c.client.send_raw(&noise(seed, 4096), &[]);
        drop(c);
        // Framed messages with random commands and payloads (sizes kept honest so the stream
        // stays framed): each gets a reply, and the connection still serves.
        let mut c = dev.client();
        for i in 0..64u64 {
            let body = noise(seed * 1000 + i, (i as usize * 7) % 200);
            let command = (body.first().copied().unwrap_or(0) % 20) as u16;
            if command == cmd::VERSION || command == cmd::DMA_UNMAP || command == cmd::DEVICE_RESET {
                continue;
            }
            let r = c.call(command, &body);
            let _ = errno(r);
        }
        c.still_serves();
    }
}

#[test]
fn second_client_is_refused_while_one_is_served() {
    let dev = Dev::start();
    let mut c = dev.client();
    let mut other = Client::connect(&dev.path()).unwrap();
    other.set_timeout(Duration::from_secs(5)).unwrap();
    let r = other.recv_message();
    assert!(
        matches!(r, Err(ClientError::Closed) | Err(ClientError::Io(_))),
        "second connection is closed: {r:?}"
    );
    c.still_serves();
    drop(c);
    // After the first client leaves, a new one is served.
    let mut c = dev.client();
    c.still_serves();
}
