//! DMA_MAP and DMA_UNMAP: overlap, sizes, descriptors, splitting, the dirty bitmap, unmap-all;
//! descriptors where none belong (or too many); maps pipelined back to back as QEMU sends them.

use std::os::fd::{AsRawFd, RawFd};

use vfio_bindings::bindings::vfio as vb;
use virtiofs_tools::vfio_user::{
    command as cmd, DeviceInfo, DmaMap, DmaUnmap, DMA_MAP_FLAG_READ, DMA_MAP_FLAG_WRITE,
};
use vmm_sys_util::eventfd::EventFd;

use crate::common::{errno, memfd, Dev, ReplyOk};

#[test]
fn dma_map_unmap_rules() {
    let dev = Dev::start();
    let mut c = dev.client();
    let mem = memfd(0x100000);
    c.dma_map(0, 0x100000, Some(&mem)).ok();
    c.dma_map(0xfffc0000, 0x40000, None).ok(); // fd-less ROM window
    assert_eq!(errno(c.dma_map(0x80000, 0x1000, None)), libc::EEXIST);
    assert_eq!(errno(c.dma_map(0x200000, 0, None)), libc::EINVAL);
    assert_eq!(errno(c.dma_map(0x200000, 0x200000, Some(&mem))), libc::EINVAL, "file too small");
    // Two descriptors for one window.
    let m = DmaMap { argsz: 32, flags: 3, offset: 0, address: 0x400000, size: 0x1000 };
    assert_eq!(
        errno(c.call_fds(cmd::DMA_MAP, &m.to_bytes(), &[mem.as_raw_fd(), mem.as_raw_fd()])),
        libc::EINVAL
    );
    assert_eq!(errno(c.dma_unmap(0x1000, 0x1000, 0)), libc::EINVAL, "splits a window");
    assert_eq!(errno(c.dma_unmap(0x500000, 0x1000, 0)), libc::ENOENT);
    assert_eq!(errno(c.dma_unmap(0, 0x1000, 1)), libc::ENOTSUP, "dirty bitmap");
    let r = c.dma_unmap(0, 0x100000, 0).ok();
    let u = DmaUnmap::decode(&r.payload).unwrap();
    assert_eq!((r.payload.len(), u.address, u.size), (DmaUnmap::SIZE, 0, 0x100000), "reply echoes the entry");
    c.dma_map(0, 0x80000, Some(&mem)).ok(); // arbitrary re-map
    assert_eq!(errno(c.dma_unmap(0, 0, 0x7)), libc::EINVAL);
    c.dma_unmap(0, 0, vb::VFIO_DMA_UNMAP_FLAG_ALL).ok();
    // The driver model's typed calls (which check the empty map reply and the unmap echo).
    let rw = DMA_MAP_FLAG_READ | DMA_MAP_FLAG_WRITE;
    c.client.dma_map(rw, 0, 0, 0x100000, Some(mem.as_raw_fd())).unwrap();
    c.client.dma_unmap(0, 0, 0x100000).unwrap();
    c.dma_map(0, 0x100000, Some(&mem)).ok();
    c.still_serves();
}

#[test]
fn unexpected_and_missing_fds() {
    let dev = Dev::start();
    let mut c = dev.client();
    let f = memfd(4096);
    let r = c.call_fds(
        cmd::DEVICE_GET_INFO,
        &DeviceInfo { argsz: 16, ..Default::default() }.to_bytes(),
        &[f.as_raw_fd()],
    );
    assert_eq!(errno(r), libc::EINVAL);
    let trig = vb::VFIO_IRQ_SET_DATA_EVENTFD | vb::VFIO_IRQ_SET_ACTION_TRIGGER;
    let e = EventFd::new(0).unwrap();
    assert_eq!(errno(c.set_irqs(trig, 0, 2, &[], &[e.as_raw_fd()])), libc::EINVAL, "one fd for two vectors");
    assert_eq!(errno(c.set_irqs(trig, 0, 1, &[], &[f.as_raw_fd()])), libc::EINVAL, "not an eventfd");
    assert_eq!(
        errno(c.set_irqs(trig, 3, 2, &[], &[e.as_raw_fd(), e.as_raw_fd()])),
        libc::EINVAL,
        "past the last vector"
    );
    // More descriptors than max_msg_fds (the kernel may refuse to send that many).
    let many: Vec<RawFd> = vec![e.as_raw_fd(); 20];
    let m = DmaMap { argsz: 32, flags: 3, offset: 0, address: 0, size: 0x1000 };
    if c.client.send_command(cmd::DMA_MAP, 0, &m.to_bytes(), &many).is_ok() {
        assert_eq!(errno(c.recv()), libc::EINVAL);
    }
    c.still_serves();
}

#[test]
fn pipelined_maps_keep_descriptors_with_their_message() {
    // QEMU sends DMA_MAP/DMA_UNMAP asynchronously, back to back; descriptors must stay with the
    // message that carried them even when the server reads several messages at once.
    let dev = Dev::start();
    let mut c = dev.client();
    let mem = memfd(0x100000);
    let mut ids = Vec::new();
    for i in 0..200u64 {
        let addr = (i % 2) * 0x100000;
        let m = DmaMap { argsz: 32, flags: 3, offset: 0, address: addr, size: 0x100000 };
        ids.push((c.send(cmd::DMA_MAP, 0, &m.to_bytes(), &[mem.as_raw_fd()]), cmd::DMA_MAP));
        let u = DmaUnmap { argsz: 24, flags: 0, address: addr, size: 0x100000 };
        ids.push((c.send(cmd::DMA_UNMAP, 0, &u.to_bytes(), &[]), cmd::DMA_UNMAP));
    }
    for (id, command) in ids {
        let r = c.recv();
        assert_eq!((r.header.msg_id, r.header.command), (id, command));
        assert_eq!(errno(&r), 0, "command {} failed", r.header.command);
    }
    c.still_serves();
}
