//! `read_frame` checks the announced length before allocating, and allocates as bytes arrive.
//! A separate test binary, so that the counting allocator sees only this test.

use redoubt_transport::{read_frame, FrameError};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::AsyncWriteExt;

struct Largest;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOC: Largest = Largest;

#[test]
fn lengths_are_checked_before_allocating() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // A 4 GiB claim against a 64 MiB maximum.
        let (mut a, mut b) = tokio::io::duplex(1 << 10);
        a.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
        LARGEST.store(0, Ordering::Relaxed);
        let r = read_frame(&mut b, 64 << 20).await;
        assert!(
            matches!(r, Err(FrameError::TooLarge { len: 0xFFFF_FFFF, max }) if max == 64 << 20),
            "{r:?}"
        );
        let largest = LARGEST.load(Ordering::Relaxed);
        assert!(
            largest < 4096,
            "allocated {largest} bytes for a refused frame"
        );

        // A permitted 60 MiB claim that sends 10 bytes and hangs up: memory follows what
        // arrived, not what was claimed.
        let (mut a, mut b) = tokio::io::duplex(1 << 10);
        a.write_all(&(60u32 << 20).to_be_bytes()).await.unwrap();
        a.write_all(&[1; 10]).await.unwrap();
        drop(a);
        LARGEST.store(0, Ordering::Relaxed);
        let r = read_frame(&mut b, 64 << 20).await;
        assert!(matches!(r, Err(FrameError::Io(_))), "{r:?}");
        let largest = LARGEST.load(Ordering::Relaxed);
        assert!(
            largest <= 128 << 10,
            "allocated {largest} bytes for 10 received"
        );
    });
}
