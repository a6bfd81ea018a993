//! An independent client against our device: the `vfio_user` 0.1.7 crate's `Client`.
//!
//! That client negotiates the version and reads device and region info in `Client::new`, but it
//! does not check reply errors and its `resettable()` is inverted, so this test asserts on what
//! it does return and cross-checks it with our own client (`virtiofs_tools::vfio_user`).

use std::os::unix::io::AsRawFd;

use vfio_bindings::bindings::vfio::{
    VFIO_DEVICE_FLAGS_RESET, VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD,
    VFIO_PCI_CONFIG_REGION_INDEX, VFIO_PCI_MSIX_IRQ_INDEX, VFIO_REGION_INFO_FLAG_MMAP,
    VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE,
};
use virtiofs_dpu::config::{Doorbells, Profile};
use virtiofs_dpu::RunningDevice;
use virtiofs_tools::memory::GuestRam;
use virtiofs_tools::vfio_user::{Client as OurClient, ClientCaps};
use vmm_sys_util::eventfd::EventFd;

#[test]
fn vfio_user_crate_client_talks_to_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("dev.sock");
    let device = RunningDevice::start_with(
        &socket,
        Profile { doorbells: Doorbells::Shared, ..Profile::default() },
        std::sync::Arc::new(virtiofs_dpu::FuseHandler::new(virtiofs_backend::RamFs::new())),
    )
    .unwrap();

    // Our client first, for the ground truth (and to check reconnecting works).
    let truth = {
        let mut c = OurClient::connect(&socket).unwrap();
        c.version(&ClientCaps::default()).unwrap();
        let info = c.device_info().unwrap();
        let mut sizes = Vec::new();
        for i in 0..info.num_regions.min(9) {
            sizes.push(c.region_info(i).unwrap().info.size);
        }
        (info, sizes)
    };

    // Version, device info and every region's info happen inside `new`.
    let mut c = vfio_user::Client::new(&socket).expect("vfio_user crate client connects");

    // Its resettable() is inverted: it reports true when the device is NOT resettable.
    let resettable = truth.0.flags & VFIO_DEVICE_FLAGS_RESET != 0;
    assert_eq!(c.resettable(), !resettable);

    // Config region.
    let cfg = c.region(VFIO_PCI_CONFIG_REGION_INDEX).expect("config region");
    assert!(cfg.size >= 256, "config region size {}", cfg.size);
    assert_eq!(
        cfg.flags & (VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE),
        VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE
    );
    assert_eq!(u64::from(cfg.index), u64::from(VFIO_PCI_CONFIG_REGION_INDEX));

    // BARs agree with our client; at least one is mappable with sparse areas (the notify area)
    // and comes with an fd.
    let mut mappable = 0;
    for i in 0..6u32 {
        let r = c.region(i).expect("BAR region listed");
        assert_eq!(r.size, truth.1[i as usize], "BAR {i} size");
        if r.flags & VFIO_REGION_INFO_FLAG_MMAP != 0 {
            assert!(r.file_offset.is_some(), "BAR {i} mappable without an fd");
            for a in &r.sparse_areas {
                assert!(a.offset + a.size <= r.size, "BAR {i} sparse area outside");
            }
            mappable += 1;
        }
    }
    assert!(mappable >= 1, "no mappable BAR (notify area)");

    // IRQ info: MSI-X with eventfds, enough vectors for config + hiprio + a request queue.
    let irq = c.get_irq_info(VFIO_PCI_MSIX_IRQ_INDEX).unwrap();
    assert_eq!(irq.index, VFIO_PCI_MSIX_IRQ_INDEX);
    assert!(irq.count >= 3, "MSI-X count {}", irq.count);
    assert_ne!(irq.flags & VFIO_IRQ_INFO_EVENTFD, 0);

    // DMA map/unmap with a memfd.
    let ram = GuestRam::new(2 << 20, 1 << 32).unwrap();
    c.dma_map(0, ram.iova_base(), ram.size(), ram.fd()).unwrap();

    // Config space through REGION_READ.
    let mut id = [0u8; 4];
    c.region_read(VFIO_PCI_CONFIG_REGION_INDEX, 0, &mut id).unwrap();
    assert_eq!(u16::from_le_bytes([id[0], id[1]]), 0x1af4);
    assert_eq!(u16::from_le_bytes([id[2], id[3]]), 0x105a);

    // Eventfds for two MSI-X vectors.
    let e0 = EventFd::new(0).unwrap();
    let e1 = EventFd::new(0).unwrap();
    c.set_irqs(
        VFIO_PCI_MSIX_IRQ_INDEX,
        VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
        0,
        2,
        &[e0.as_raw_fd(), e1.as_raw_fd()],
    )
    .unwrap();

    c.dma_unmap(ram.iova_base(), ram.size()).unwrap();

    // The stream is still in sync after all that: another config read works.
    let mut hdr = [0u8; 2];
    c.region_read(VFIO_PCI_CONFIG_REGION_INDEX, 0x34, &mut hdr[..1]).unwrap();
    assert_ne!(hdr[0], 0, "capability pointer");
    if resettable {
        c.reset().unwrap();
    }
    c.shutdown().unwrap();
    drop(c);
    device.stop().unwrap();
}
