//! The memory intrinsics the compiler expects from libc.
//!
//! `memset`, `memcpy` and `memmove` are single `rep stosb` / `rep movsb`
//! instructions: the instruction emulator handles them in one step, and the
//! compiler cannot turn them into SSE code (it vectorised the former byte
//! loops into `movd`/`pshufd`, which the emulator cannot execute).

/// # Safety
/// `dst` must be valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn memset(dst: *mut u8, c: i32, n: usize) -> *mut u8 {
    core::arch::asm!(
        "cld",
        "rep stosb",
        inout("rdi") dst => _,
        inout("rcx") n => _,
        in("al") c as u8,
        options(nostack)
    );
    dst
}

/// # Safety
/// `dst` and `src` valid for `n` bytes, not overlapping.
#[no_mangle]
pub unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    core::arch::asm!(
        "cld",
        "rep movsb",
        inout("rdi") dst => _,
        inout("rsi") src => _,
        inout("rcx") n => _,
        options(nostack)
    );
    dst
}

/// # Safety
/// `dst` and `src` valid for `n` bytes; may overlap.
#[no_mangle]
pub unsafe extern "C" fn memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dst as usize) <= (src as usize) || (dst as usize) >= (src as usize).wrapping_add(n) {
        memcpy(dst, src, n)
    } else if n > 0 {
        // Overlapping with dst above src: copy backwards.
        core::arch::asm!(
            "std",
            "rep movsb",
            "cld",
            inout("rdi") dst.add(n - 1) => _,
            inout("rsi") src.add(n - 1) => _,
            inout("rcx") n => _,
            options(nostack)
        );
        dst
    } else {
        dst
    }
}

/// # Safety
/// `a` and `b` valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i < n {
        let (x, y) = (
            core::ptr::read_volatile(a.add(i)),
            core::ptr::read_volatile(b.add(i)),
        );
        if x != y {
            return x as i32 - y as i32;
        }
        i += 1;
    }
    0
}

/// # Safety
/// As `memcmp`.
#[no_mangle]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    memcmp(a, b, n)
}
