//! Integer formatting that is safe under the instruction emulator.
//!
//! `core`'s `Display` for integers is precompiled with SSE2 and, for values of
//! 1000 and more, executes `movd`/`pinsrw`, which the emulator cannot run (the
//! VM ends with a KVM internal error). Format integers through these wrappers:
//! `println!("{}", Dec(x))`, `Hex(x)` (with `0x`), `Int(x)` for signed values.
//! They write with `Formatter::write_str` only (width and fill are ignored).

use core::fmt;
use core::mem::MaybeUninit;

/// Unsigned decimal.
#[derive(Clone, Copy)]
pub struct Dec(pub u64);
/// Unsigned hexadecimal with a `0x` prefix.
#[derive(Clone, Copy)]
pub struct Hex(pub u64);
/// Signed decimal.
#[derive(Clone, Copy)]
pub struct Int(pub i64);

fn digits(f: &mut fmt::Formatter<'_>, mut v: u64, radix: u64, neg: bool) -> fmt::Result {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    // Not initialised: zeroing a stack array would itself emit SSE stores.
    let mut buf = [MaybeUninit::<u8>::uninit(); 24];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = MaybeUninit::new(DIGITS[(v % radix) as usize]);
        v /= radix;
        if v == 0 {
            break;
        }
    }
    if neg {
        i -= 1;
        buf[i] = MaybeUninit::new(b'-');
    }
    // SAFETY: bytes i.. were written above, all ASCII.
    let s = unsafe {
        core::str::from_utf8_unchecked(core::slice::from_raw_parts(
            buf.as_ptr().add(i) as *const u8,
            buf.len() - i,
        ))
    };
    f.write_str(s)
}

impl fmt::Display for Dec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        digits(f, self.0, 10, false)
    }
}

impl fmt::Display for Hex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("0x")?;
        digits(f, self.0, 16, false)
    }
}

impl fmt::Display for Int {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        digits(f, self.0.unsigned_abs(), 10, self.0 < 0)
    }
}
