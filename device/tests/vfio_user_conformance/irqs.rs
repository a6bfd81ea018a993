//! DEVICE_GET_IRQ_INFO and DEVICE_SET_IRQS: assigning eventfds, triggering, DATA_BOOL, masking
//! with the PBA, disabling, malformed requests.

use std::os::fd::AsRawFd;

use vfio_bindings::bindings::vfio as vb;
use virtiofs_tools::vfio_user::{command as cmd, IrqInfo, IrqSet};
use vmm_sys_util::eventfd::EventFd;

use crate::common::{errno, Dev, ReplyOk};

#[test]
fn irq_info() {
    let dev = Dev::start();
    let mut c = dev.client();
    let ii = |index| IrqInfo { argsz: 16, index, ..Default::default() }.to_bytes();
    let r = c.call(cmd::DEVICE_GET_IRQ_INFO, &ii(vb::VFIO_PCI_MSIX_IRQ_INDEX)).ok();
    let info = IrqInfo::decode(&r.payload).unwrap();
    assert_eq!(info.count, 4, "config + hiprio + 2 request queues");
    assert_ne!(info.flags & vb::VFIO_IRQ_INFO_EVENTFD, 0);
    let r = c.call(cmd::DEVICE_GET_IRQ_INFO, &ii(vb::VFIO_PCI_MSI_IRQ_INDEX)).ok();
    assert_eq!(IrqInfo::decode(&r.payload).unwrap().count, 0);
    assert_eq!(errno(c.call(cmd::DEVICE_GET_IRQ_INFO, &ii(5))), libc::EINVAL);
    // The typed call (which checks the reply's size and index) agrees.
    assert_eq!(c.client.irq_info(vb::VFIO_PCI_MSIX_IRQ_INDEX).unwrap(), info);
    c.still_serves();
}

#[test]
fn set_irqs_assign_trigger_mask_disable() {
    let dev = Dev::start();
    let mut c = dev.client();
    let e0 = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let e1 = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let trig_fd = vb::VFIO_IRQ_SET_DATA_EVENTFD | vb::VFIO_IRQ_SET_ACTION_TRIGGER;
    c.set_irqs(trig_fd, 0, 2, &[], &[e0.as_raw_fd(), e1.as_raw_fd()]).ok();
    // Client-side trigger (DATA_NONE) reaches the eventfds.
    c.set_irqs(vb::VFIO_IRQ_SET_DATA_NONE | vb::VFIO_IRQ_SET_ACTION_TRIGGER, 0, 2, &[], &[]).ok();
    assert_eq!((e0.read().unwrap(), e1.read().unwrap()), (1, 1));
    // DATA_BOOL selects vectors.
    c.set_irqs(vb::VFIO_IRQ_SET_DATA_BOOL | vb::VFIO_IRQ_SET_ACTION_TRIGGER, 0, 2, &[0, 1], &[]).ok();
    assert!(e0.read().is_err());
    assert_eq!(e1.read().unwrap(), 1);
    // Masked: pends; unmask delivers.
    c.set_irqs(vb::VFIO_IRQ_SET_DATA_NONE | vb::VFIO_IRQ_SET_ACTION_MASK, 1, 1, &[], &[]).ok();
    c.set_irqs(vb::VFIO_IRQ_SET_DATA_NONE | vb::VFIO_IRQ_SET_ACTION_TRIGGER, 1, 1, &[], &[]).ok();
    assert!(e1.read().is_err());
    let pba = c.region_read(1, 0x800, 1).ok();
    assert_eq!(pba.payload[16] & 0b10, 0b10, "pending bit visible in the PBA");
    assert_eq!(c.client.read_le(1, 0x800, 1).unwrap() & 0b10, 0b10, "and through the typed read");
    c.set_irqs(vb::VFIO_IRQ_SET_DATA_NONE | vb::VFIO_IRQ_SET_ACTION_UNMASK, 1, 1, &[], &[]).ok();
    assert_eq!(e1.read().unwrap(), 1);
    // Per-vector disable (eventfd with no fds), then count 0 disables everything.
    c.set_irqs(trig_fd, 0, 1, &[], &[]).ok();
    c.set_irqs(vb::VFIO_IRQ_SET_DATA_NONE | vb::VFIO_IRQ_SET_ACTION_TRIGGER, 0, 2, &[], &[]).ok();
    assert!(e0.read().is_err());
    assert_eq!(e1.read().unwrap(), 1);
    c.set_irqs(vb::VFIO_IRQ_SET_DATA_NONE | vb::VFIO_IRQ_SET_ACTION_TRIGGER, 0, 0, &[], &[]).ok();
    c.set_irqs(vb::VFIO_IRQ_SET_DATA_NONE | vb::VFIO_IRQ_SET_ACTION_TRIGGER, 0, 2, &[], &[]).ok();
    assert!(e1.read().is_err());
    // The typed call (which checks the reply is empty) assigns and triggers too.
    let msix = vb::VFIO_PCI_MSIX_IRQ_INDEX;
    c.client.set_irqs(msix, trig_fd, 1, 1, &[e1.as_raw_fd()], &[]).unwrap();
    c.client
        .set_irqs(msix, vb::VFIO_IRQ_SET_DATA_BOOL | vb::VFIO_IRQ_SET_ACTION_TRIGGER, 1, 1, &[], &[1])
        .unwrap();
    assert_eq!(e1.read().unwrap(), 1);
    // Malformed: two data kinds, bool array of the wrong length, argsz too small.
    let both = vb::VFIO_IRQ_SET_DATA_NONE | vb::VFIO_IRQ_SET_DATA_BOOL | vb::VFIO_IRQ_SET_ACTION_TRIGGER;
    assert_eq!(errno(c.set_irqs(both, 0, 1, &[], &[])), libc::EINVAL);
    assert_eq!(
        errno(c.set_irqs(vb::VFIO_IRQ_SET_DATA_BOOL | vb::VFIO_IRQ_SET_ACTION_TRIGGER, 0, 2, &[1], &[])),
        libc::EINVAL
    );
    let p = IrqSet { argsz: 8, flags: trig_fd, index: 2, start: 0, count: 1 };
    assert_eq!(errno(c.call(cmd::DEVICE_SET_IRQS, &p.to_bytes())), libc::EINVAL);
    c.still_serves();
}
