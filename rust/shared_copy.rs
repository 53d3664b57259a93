//! Copies out of memory that another thread may write meanwhile: a caller's array, which Python code
//! on another thread (free-threaded Python) or native code that released the interpreter can change
//! while the bindings read it.
//!
//! The bindings copy such arrays first and validate and use only the copy. The copy itself must not
//! let the compiler assume the source is stable, so it is never a plain `memcpy` of Rust memory:
//! - on x86-64, one `rep movsb` in inline assembly, opaque to the compiler. Its effect is a sequence
//!   of byte loads from the source (each one a relaxed atomic byte load in the abstract machine's
//!   terms) and stores into the caller's fresh buffer. It runs at `memcpy` speed;
//! - elsewhere, relaxed 8-byte atomic loads, two ids per load.
//!
//! A racing write can tear a value (its bytes from before and after the write), which is still a
//! valid `u32`: what the copy holds is what gets validated and used.
//!
//! Measured on a 2,048-id prompt admission (`benches/manager_loop.py`): the 8-byte atomic loop cost
//! 0.36 µs more than `memcpy` in place (cold-ish source arrays); `rep movsb` is `memcpy`'s speed.

// Used by the bindings (and tested here); a build without them has no caller.
#![cfg_attr(not(feature = "python"), allow(dead_code))]

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Append the `len` 32-bit values at `src` to `out`.
///
/// # Safety
/// `src` points to `len` 4-byte-aligned values that stay allocated for the whole call (they may be
/// written meanwhile), and `out` has room for `len` more elements (`capacity - len >= len`).
pub(crate) unsafe fn copy_shared_u32(src: *const u32, len: usize, out: &mut Vec<u32>) {
    debug_assert!(out.capacity() - out.len() >= len);
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the caller's contract.
        unsafe { copy_rep_movsb(src, len, out) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // SAFETY: the caller's contract.
        unsafe { copy_atomic(src, len, out) }
    }
}

/// Copy `bytes` bytes from `src` to `dst` with one `rep movsb`: opaque to the compiler (see the module
/// doc), `memcpy`'s speed.
///
/// # Safety
/// `src` is `bytes` readable bytes that stay allocated for the call (they may be written meanwhile);
/// `dst` is `bytes` writable bytes of the caller's own, disjoint from them.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn rep_movsb(dst: *mut u8, src: *const u8, bytes: usize) {
    // SAFETY: the caller's contract. The asm reads and writes only through these two input pointers,
    // leaves the direction flag clear (as it found it) and no status flag changed, and touches no stack.
    unsafe {
        std::arch::asm!(
            "rep movsb",
            inout("rcx") bytes => _,
            inout("rsi") src => _,
            inout("rdi") dst => _,
            options(nostack, preserves_flags),
        );
    }
}

/// `copy_shared_u32` with one `rep movsb`.
///
/// # Safety
/// As for [`copy_shared_u32`].
#[cfg(target_arch = "x86_64")]
unsafe fn copy_rep_movsb(src: *const u32, len: usize, out: &mut Vec<u32>) {
    let start = out.len();
    // SAFETY: `out` has room for `len` more values (the caller's contract): `len * 4` writable bytes
    // of our own allocation, disjoint from the `len * 4` readable bytes of the source.
    unsafe {
        rep_movsb(out.as_mut_ptr().add(start).cast(), src.cast(), len * 4);
        // SAFETY: the copy wrote these `len` values (any bytes are a valid u32).
        out.set_len(start + len);
    }
}

/// Append the `len` 64-bit values at `src` to `out` as u32, if every one lies in `0..2**32`; else
/// `Err(v)`, the first value out of range (`out` then holds an unspecified prefix).
///
/// Chunks of 512 go through a stack buffer: copied as by [`copy_shared_u32`] (one `rep movsb`, or
/// relaxed atomic loads), then range-checked and narrowed in vectorised passes over our own copy.
///
/// # Safety
/// `src` points to `len` 8-byte-aligned values that stay allocated for the whole call (they may be
/// written meanwhile), and `out` has room for `len` more elements.
pub(crate) unsafe fn copy_shared_i64_to_u32(
    src: *const i64,
    len: usize,
    out: &mut Vec<u32>,
) -> Result<(), i64> {
    const CHUNK: usize = 512;
    debug_assert!(out.capacity() - out.len() >= len);
    // Not zeroed first: a 4 KiB memset on every call would cost more than a short copy.
    let mut buf = [std::mem::MaybeUninit::<i64>::uninit(); CHUNK];
    let mut done = 0;
    while done < len {
        let n = CHUNK.min(len - done);
        // SAFETY: `done + n <= len` values of the caller's (its contract); `buf` holds `n`.
        let chunk = unsafe { copy_shared_i64(src.add(done), &mut buf[..n]) };
        if chunk.iter().fold(0u64, |acc, &v| acc | (v as u64 >> 32)) != 0 {
            let bad = chunk.iter().copied().find(|&v| u32::try_from(v).is_err());
            return Err(bad.unwrap_or(-1));
        }
        out.extend(chunk.iter().map(|&v| v as u32));
        done += n;
    }
    Ok(())
}

/// Append the `len` 64-bit values at `src` to `out`.
///
/// # Safety
/// `src` points to `len` 8-byte-aligned values that stay allocated for the whole call (they may be
/// written meanwhile), and `out` has room for `len` more elements.
pub(crate) unsafe fn copy_shared_i64_vec(src: *const i64, len: usize, out: &mut Vec<i64>) {
    let start = out.len();
    // SAFETY: the caller's contract; `out` has `len` spare elements.
    unsafe {
        copy_shared_i64(src, &mut out.spare_capacity_mut()[..len]);
        // SAFETY: the copy initialised those `len` values.
        out.set_len(start + len);
    }
}

/// Fill `dst` from the `dst.len()` 64-bit values at `src`, which other threads may write meanwhile;
/// returns `dst`, initialised.
///
/// # Safety
/// `src` points to `dst.len()` 8-byte-aligned values that stay allocated for the call.
unsafe fn copy_shared_i64(src: *const i64, dst: &mut [std::mem::MaybeUninit<i64>]) -> &[i64] {
    // A few values (an `append`'s tokens) with atomic loads: `rep movsb` has a start-up cost.
    if cfg!(target_arch = "x86_64") && dst.len() > 16 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `dst` is `dst.len() * 8` writable bytes of our own, disjoint from as many readable
        // bytes of the source (the caller's contract).
        unsafe {
            rep_movsb(dst.as_mut_ptr().cast(), src.cast(), dst.len() * 8);
        }
    } else {
        // SAFETY: aligned and live (the caller's contract); AtomicI64 has i64's layout.
        let s = unsafe {
            std::slice::from_raw_parts(src.cast::<std::sync::atomic::AtomicI64>(), dst.len())
        };
        for (d, v) in dst.iter_mut().zip(s) {
            d.write(v.load(Ordering::Relaxed));
        }
    }
    // SAFETY: every element was written above (any bytes are a valid i64).
    unsafe { std::slice::from_raw_parts(dst.as_ptr().cast::<i64>(), dst.len()) }
}

/// `copy_shared_u32` with relaxed atomic loads: 8 bytes at a time (two ids; an 8-byte load reads
/// each as a 4-byte atomic load would), the first alone if it is not 8-aligned, the last alone if
/// one is left.
///
/// # Safety
/// As for [`copy_shared_u32`].
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
unsafe fn copy_atomic(src: *const u32, len: usize, out: &mut Vec<u32>) {
    if len == 0 {
        return;
    }
    // SAFETY: `i < len`, within the caller's aligned values; AtomicU32 has u32's layout.
    let single = |i: usize| unsafe { (*src.add(i).cast::<AtomicU32>()).load(Ordering::Relaxed) };
    let head = usize::from(src as usize % 8 != 0);
    let pairs = (len - head) / 2;
    let first = out.len();
    if head == 1 {
        out.push(single(0));
    }
    // SAFETY: after `head` values the pointer is 8-aligned, and `pairs` 8-byte words lie within the
    // `len` values; AtomicU64 has u64's layout.
    let words = unsafe { std::slice::from_raw_parts(src.add(head).cast::<AtomicU64>(), pairs) };
    // `extend` over the pairs, not `push` (five times slower: a capacity check per id).
    out.extend(words.iter().flat_map(|w| {
        let v = w.load(Ordering::Relaxed).to_ne_bytes();
        [
            u32::from_ne_bytes([v[0], v[1], v[2], v[3]]),
            u32::from_ne_bytes([v[4], v[5], v[6], v[7]]),
        ]
    }));
    if out.len() - first < len {
        out.push(single(len - 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Copy = unsafe fn(*const u32, usize, &mut Vec<u32>);

    fn copies() -> Vec<(&'static str, Copy)> {
        let mut v: Vec<(&'static str, Copy)> =
            vec![("atomic", copy_atomic), ("shared", copy_shared_u32)];
        #[cfg(target_arch = "x86_64")]
        v.push(("rep movsb", copy_rep_movsb));
        v
    }

    #[test]
    fn every_copy_equals_the_source_at_every_offset_and_length() {
        let base: Vec<u32> = (0..80u32)
            .map(|i| i.wrapping_mul(0x9E37_79B9) ^ (i << 3))
            .collect();
        for (name, copy) in copies() {
            for offset in 0..3 {
                for len in [0usize, 1, 2, 3, 15, 16, 17, 33, 64, 65, 77] {
                    let want = &base[offset..offset + len];
                    let mut out = vec![7u32, 9];
                    out.reserve(len);
                    // SAFETY: `want` is live and aligned; `out` has room for `len` more.
                    unsafe { copy(want.as_ptr(), len, &mut out) };
                    assert_eq!(&out[..2], &[7, 9], "{name}: the existing elements are kept");
                    assert_eq!(&out[2..], want, "{name} offset {offset} len {len}");
                }
            }
        }
    }

    #[test]
    fn int64_values_are_narrowed_exactly_or_the_first_out_of_range_one_is_named() {
        for len in [0usize, 1, 7, 511, 512, 513, 1500] {
            let src: Vec<i64> = (0..len as i64)
                .map(|i| (i * 2_654_435_761) % (1 << 32))
                .collect();
            let mut out = Vec::with_capacity(len);
            // SAFETY: `src` is live and aligned; `out` has room for `len`.
            assert_eq!(
                unsafe { copy_shared_i64_to_u32(src.as_ptr(), len, &mut out) },
                Ok(())
            );
            assert_eq!(
                out,
                src.iter().map(|&v| v as u32).collect::<Vec<_>>(),
                "len {len}"
            );
        }
        for (pos, bad) in [
            (0usize, -1i64),
            (600, 1 << 32),
            (1499, i64::MIN),
            (700, i64::MAX),
        ] {
            let mut src = vec![5i64; 1500];
            src[pos] = bad;
            if pos + 50 < src.len() {
                src[pos + 50] = -7; // a later bad value is not the one named
            }
            let mut out = Vec::with_capacity(1500);
            // SAFETY: as above.
            let got = unsafe { copy_shared_i64_to_u32(src.as_ptr(), 1500, &mut out) };
            assert_eq!(got, Err(bad), "pos {pos}");
        }
    }

    #[test]
    fn int64_values_are_copied_whole_at_every_length() {
        // Both sides of the atomic / rep movsb threshold (16) and every sign and magnitude.
        let base: Vec<i64> = (0..80i64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15_u64 as i64) ^ -i)
            .collect();
        for len in [0usize, 1, 2, 15, 16, 17, 33, 64, 80] {
            let want = &base[..len];
            let mut out = vec![-3i64];
            out.reserve(len);
            // SAFETY: `want` is live and aligned; `out` has room for `len` more.
            unsafe { copy_shared_i64_vec(want.as_ptr(), len, &mut out) };
            assert_eq!(out[0], -3, "the existing element is kept");
            assert_eq!(&out[1..], want, "len {len}");
        }
    }

    #[test]
    fn a_set_sign_bit_anywhere_is_copied() {
        for (name, copy) in copies() {
            for pos in [0usize, 1, 30, 62, 63] {
                let mut src = vec![1u32; 64];
                src[pos] = 0x8000_0000;
                for offset in 0..2 {
                    let view = &src[offset..];
                    let mut out = Vec::with_capacity(view.len());
                    // SAFETY: as above.
                    unsafe { copy(view.as_ptr(), view.len(), &mut out) };
                    assert_eq!(out, view, "{name} pos {pos} offset {offset}");
                }
            }
        }
    }
}
