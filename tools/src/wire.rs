//! Byte encoding of wire structures without `unsafe`.
//!
//! Every protocol structure the driver speaks (vfio-user messages, virtio rings, FUSE) is a
//! `#[repr(C)]`-like list of little-endian integers with explicit padding. Instead of casting bytes
//! into structs, [`wire_struct!`](crate::wire_struct) generates `encode`/`decode` from the field
//! list, so a short or malformed buffer from the device is a `None`, never undefined behaviour.
//!
//! vfio-user is specified in host endianness and FUSE/virtio in little endian; this crate only
//! targets little-endian hosts (x86_64, aarch64), where both are the same.
//!
//! **A second implementation on purpose.** The device has its own vfio-user wire format
//! (`device/src/vfio_user/wire.rs`) and the backend its own FUSE ABI (`backend/src/abi.rs`); the
//! structures this crate encodes ([`crate::vfio_user`], [`crate::virtqueue`],
//! [`crate::fuse_abi`]) are written from the specifications alone and share no code with them
//! (the crate depends on neither; tools/test.sh checks). The device's conformance tests and
//! every end-to-end test therefore run one implementation against the other, so a layout mistake
//! on either side fails a test instead of cancelling out, as it would if both sides used one
//! definition. Keep them apart; settle a mismatch against the specification.

/// A fixed-size field of a wire structure.
pub trait WireField: Sized + Copy {
    /// Encoded size in bytes.
    const SIZE: usize;
    /// Appends the little-endian encoding to `out`.
    fn put(&self, out: &mut Vec<u8>);
    /// Decodes from the first [`Self::SIZE`] bytes of `b` (caller checks the length).
    fn get(b: &[u8]) -> Self;
}

macro_rules! int_field {
    ($($t:ty),*) => {$(
        impl WireField for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn put(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(b: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(&b[..std::mem::size_of::<$t>()]);
                <$t>::from_le_bytes(a)
            }
        }
    )*};
}
int_field!(u8, u16, u32, u64, i32, i64);

impl<T: WireField + Default, const N: usize> WireField for [T; N] {
    const SIZE: usize = T::SIZE * N;
    fn put(&self, out: &mut Vec<u8>) {
        for x in self {
            x.put(out);
        }
    }
    fn get(b: &[u8]) -> Self {
        let mut a = [T::default(); N];
        for (i, x) in a.iter_mut().enumerate() {
            *x = T::get(&b[i * T::SIZE..]);
        }
        a
    }
}

/// Declares a plain wire structure with `SIZE`, `encode_into`, `to_bytes` and `decode`.
#[macro_export]
macro_rules! wire_struct {
    (
        $(#[$m:meta])*
        pub struct $name:ident {
            $( $(#[$fm:meta])* pub $f:ident : $t:ty ),* $(,)?
        }
    ) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $name {
            $( $(#[$fm])* pub $f: $t ),*
        }

        impl $name {
            /// Encoded size in bytes.
            pub const SIZE: usize = 0 $( + <$t as $crate::wire::WireField>::SIZE )*;

            /// Appends the encoding to `out`.
            pub fn encode_into(&self, out: &mut Vec<u8>) {
                $( $crate::wire::WireField::put(&self.$f, out); )*
            }

            /// Returns the encoding.
            pub fn to_bytes(self) -> Vec<u8> {
                let mut v = Vec::with_capacity(Self::SIZE);
                self.encode_into(&mut v);
                v
            }

            /// Decodes from the start of `b`; `None` if `b` is shorter than [`Self::SIZE`].
            #[allow(unused_assignments)]
            pub fn decode(b: &[u8]) -> Option<Self> {
                if b.len() < Self::SIZE {
                    return None;
                }
                let mut off = 0usize;
                $(
                    let $f = <$t as $crate::wire::WireField>::get(&b[off..]);
                    off += <$t as $crate::wire::WireField>::SIZE;
                )*
                Some(Self { $( $f ),* })
            }
        }
    };
}

#[cfg(test)]
mod tests {
    wire_struct! {
        /// Test structure.
        pub struct T {
            /// a
            pub a: u16,
            /// b
            pub b: u32,
            /// c
            pub c: [u16; 3],
            /// d
            pub d: i64,
        }
    }

    #[test]
    fn roundtrip() {
        let t = T { a: 0x1234, b: 0xdead_beef, c: [1, 2, 3], d: -5 };
        let b = t.to_bytes();
        assert_eq!(b.len(), T::SIZE);
        assert_eq!(T::SIZE, 2 + 4 + 6 + 8);
        assert_eq!(&b[..2], &[0x34, 0x12]);
        assert_eq!(T::decode(&b), Some(t));
        assert_eq!(T::decode(&b[..T::SIZE - 1]), None);
    }
}
