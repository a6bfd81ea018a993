//! Shared by the end-to-end tests that run on both virtqueue layouts: `on_both_layouts!(a, b)`
//! turns scenario functions `a(ring: RingLayout)` and `b(ring: RingLayout)` into the tests
//! `split::a`, `split::b`, `packed::a` and `packed::b`. The calling file imports `RingLayout`.

/// Two `#[test]`s per scenario, one per virtqueue layout.
macro_rules! on_both_layouts {
    ($($name:ident),* $(,)?) => {
        mod split {
            $(#[test]
            fn $name() {
                super::$name(super::RingLayout::Split)
            })*
        }
        mod packed {
            $(#[test]
            fn $name() {
                super::$name(super::RingLayout::Packed)
            })*
        }
    };
}
