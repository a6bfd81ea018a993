//! Device and region information, region reads and writes, DEVICE_RESET.

use vfio_bindings::bindings::vfio as vb;
use virtiofs_device::config::{Doorbells, Profile};
use virtiofs_tools::vfio_user::{
    command as cmd, parse_region_caps, CapHeader, DeviceInfo, RegionInfoRaw, SparseArea, SparseMmapHead,
    REGION_INFO_SIZE,
};

use crate::common::{errno, Dev, ReplyOk};

#[test]
fn device_get_info() {
    let dev = Dev::start();
    let mut c = dev.client();
    let r = c.call(cmd::DEVICE_GET_INFO, &DeviceInfo { argsz: 16, ..Default::default() }.to_bytes()).ok();
    let info = DeviceInfo::decode(&r.payload).unwrap();
    assert_eq!(info.flags, vb::VFIO_DEVICE_FLAGS_RESET | vb::VFIO_DEVICE_FLAGS_PCI);
    assert_eq!((info.num_regions, info.num_irqs), (9, 5));
    assert_eq!(r.payload.len(), DeviceInfo::SIZE);
}

#[test]
fn region_info_with_sparse_mmap_and_fd() {
    let dev = Dev::start();
    let mut c = dev.client();
    let ri = |index, argsz| RegionInfoRaw { argsz, index, ..Default::default() }.to_bytes();
    let r = c.call(cmd::DEVICE_GET_REGION_INFO, &ri(7, 32)).ok();
    let info = RegionInfoRaw::decode(&r.payload).unwrap();
    assert_eq!(
        (info.size, info.flags),
        (256, vb::VFIO_REGION_INFO_FLAG_READ | vb::VFIO_REGION_INFO_FLAG_WRITE)
    );
    // BAR4, asked with too small a buffer: argsz tells the full size, no caps, no fd.
    let r = c.call(cmd::DEVICE_GET_REGION_INFO, &ri(4, 32)).ok();
    let info = RegionInfoRaw::decode(&r.payload).unwrap();
    assert_eq!((info.argsz, r.payload.len(), r.fds.len()), (64, 32, 0));
    let r = c.call(cmd::DEVICE_GET_REGION_INFO, &ri(4, 64)).ok();
    let info = RegionInfoRaw::decode(&r.payload).unwrap();
    assert_eq!(info.size, 0x4000);
    assert_ne!(info.flags & vb::VFIO_REGION_INFO_FLAG_MMAP, 0);
    assert_eq!(info.cap_offset, REGION_INFO_SIZE as u32);
    let cap = CapHeader::decode(&r.payload[32..]).unwrap();
    let head = SparseMmapHead::decode(&r.payload[32 + CapHeader::SIZE..]).unwrap();
    let area = SparseArea::decode(&r.payload[48..]).unwrap();
    assert_eq!((cap.id, cap.version, cap.next), (1, 1, 0));
    assert_eq!((head.nr_areas, area.offset, area.size), (1, 0x3000, 0x1000));
    // The driver model's parser of the capability chain reads the same.
    let (areas, others) = parse_region_caps(&info, &r.payload).unwrap();
    assert_eq!((areas, others), (vec![SparseArea { offset: 0x3000, size: 0x1000 }], vec![]));
    assert_eq!(r.fds.len(), 1, "the notify area's fd comes with the reply");
    assert!(r.fds[0].metadata().unwrap().len() >= 0x4000);
    // The typed call (asks with 32, then with the argsz the server needs) agrees.
    let region = c.client.region_info(4).unwrap();
    assert_eq!(region.mappable_areas(), vec![SparseArea { offset: 0x3000, size: 0x1000 }]);
    assert!(region.fd.is_some());
    // BAR1 (MSI-X) exists, BAR0 does not.
    let r = c.call(cmd::DEVICE_GET_REGION_INFO, &ri(1, 32)).ok();
    assert_eq!(RegionInfoRaw::decode(&r.payload).unwrap().size, 0x1000);
    let r = c.call(cmd::DEVICE_GET_REGION_INFO, &ri(0, 32)).ok();
    assert_eq!(RegionInfoRaw::decode(&r.payload).unwrap().size, 0);
    assert_eq!(errno(c.call(cmd::DEVICE_GET_REGION_INFO, &ri(9, 32))), libc::EINVAL);
    c.still_serves();
}

#[test]
fn region_info_without_mmap_when_doorbells_come_through_the_socket() {
    let profile =
        Profile { request_queues: 2, queue_size: 16, doorbells: Doorbells::Socket, ..Profile::default() };
    let dev = Dev::start_profile(None, None, profile);
    let mut c = dev.client();
    let ri = RegionInfoRaw { argsz: 64, index: 4, ..Default::default() };
    let r = c.call(cmd::DEVICE_GET_REGION_INFO, &ri.to_bytes()).ok();
    let info = RegionInfoRaw::decode(&r.payload).unwrap();
    assert_eq!(info.size, 0x4000);
    assert_eq!(info.flags, vb::VFIO_REGION_INFO_FLAG_READ | vb::VFIO_REGION_INFO_FLAG_WRITE, "not mmappable");
    assert_eq!((info.argsz, info.cap_offset, r.payload.len(), r.fds.len()), (32, 0, 32, 0));
    assert!(c.client.region_info(4).unwrap().mappable_areas().is_empty());
    c.still_serves();
}

#[test]
fn region_read_write_config_space() {
    let dev = Dev::start();
    let mut c = dev.client();
    assert_eq!(c.read32(7, 0), 0x105a_1af4);
    let r = c.region_write(7, 0x3c, &[0x0b]).ok();
    assert_eq!(r.payload.len(), 16, "write reply echoes offset/region/count");
    assert_eq!(c.read32(7, 0x3c) & 0xff, 0x0b);
    // Bad region, bad offset, offset overflow, oversized transfer.
    assert_eq!(errno(c.region_read(2, 0, 4)), libc::EINVAL);
    assert_eq!(errno(c.region_read(7, 254, 4)), libc::EINVAL);
    assert_eq!(errno(c.region_read(7, u64::MAX - 1, 4)), libc::EINVAL);
    assert_eq!(errno(c.region_read(12, 0, 4)), libc::EINVAL);
    assert_eq!(errno(c.region_read(4, 0, 2 << 20)), libc::E2BIG);
    assert_eq!(errno(c.region_read(4, 0x3ffe, 4)), libc::EINVAL, "past the end of BAR4 (notify area)");
    assert_eq!(errno(c.region_read(4, 0x4000, 4)), libc::EINVAL);
    assert_eq!(c.read32(4, 0x3000), 0, "notify area reads as zero");
    assert_eq!(errno(c.region_write(7, 0x100, &[1])), libc::EINVAL);
    c.still_serves();
}

#[test]
fn device_reset_returns_registers_to_reset_state() {
    let dev = Dev::start();
    let mut c = dev.client();
    c.region_write(4, 0x14, &[3]).ok(); // ACKNOWLEDGE | DRIVER
    assert_eq!(c.read32(4, 0x14) & 0xff, 3);
    c.call(cmd::DEVICE_RESET, &[]).ok();
    assert_eq!(c.read32(4, 0x14) & 0xff, 0);
    // The typed DEVICE_RESET (which checks the reply is empty) too.
    c.region_write(4, 0x14, &[3]).ok();
    c.client.device_reset().unwrap();
    assert_eq!(c.read32(4, 0x14) & 0xff, 0);
    c.still_serves();
}
