//! Issue 31 item 5: do bfloat16 GEMM inputs with float32 sums (AVX512_BF16's vdpbf16ps) pay for
//! the embedding's register tiles? One tile as dpw's float32 ones are (6 rows × 32 columns, sums
//! in registers) over a depth of 700 (W̄ = xᵀz̄ of a task), once with float32 FMAs and once with
//! vdpbf16ps on the same values rounded to bfloat16 (pairs of depth steps per instruction).
//! Reports GFLOP/s of each (a multiply-add = 2) and their ratio. Standalone, not part of the crate:
//!
//!     rustc -O bench/bf16_tile.rs -o /tmp/bf16_tile && /tmp/bf16_tile
//!
//! Needs a CPU with AVX512_BF16 (`grep avx512_bf16 /proc/cpuinfo`).
use std::arch::x86_64::*;
const K: usize = 700;
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
unsafe fn f32k(a: &[f32], b: &[f32], c: &mut [f32]) {
    // a: 6 × K row-major, b: K × 32, c: 6 × 32.
    let mut acc = [[_mm512_setzero_ps(); 2]; 6];
    for k in 0..K {
        let b0 = _mm512_loadu_ps(b.as_ptr().add(k * 32));
        let b1 = _mm512_loadu_ps(b.as_ptr().add(k * 32 + 16));
        for i in 0..6 {
            let av = _mm512_set1_ps(*a.get_unchecked(i * K + k));
            acc[i][0] = _mm512_fmadd_ps(av, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(av, b1, acc[i][1]);
        }
    }
    for i in 0..6 {
        _mm512_storeu_ps(c.as_mut_ptr().add(i * 32), acc[i][0]);
        _mm512_storeu_ps(c.as_mut_ptr().add(i * 32 + 16), acc[i][1]);
    }
}
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
unsafe fn bf16k(a: &[u32], b: &[u16], c: &mut [f32]) {
    // a: 6 × K/2 pairs of bfloat16 (one u32 each), b: K/2 × 32 × 2 bfloat16 (vdpbf16ps's layout).
    let mut acc = [[_mm512_setzero_ps(); 2]; 6];
    for k in 0..K / 2 {
        let b0: __m512bh =
            std::mem::transmute(_mm512_loadu_si512(b.as_ptr().add(k * 64) as *const _));
        let b1: __m512bh =
            std::mem::transmute(_mm512_loadu_si512(b.as_ptr().add(k * 64 + 32) as *const _));
        for i in 0..6 {
            let av: __m512bh =
                std::mem::transmute(_mm512_set1_epi32(*a.get_unchecked(i * K / 2 + k) as i32));
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], av, b0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], av, b1);
        }
    }
    for i in 0..6 {
        _mm512_storeu_ps(c.as_mut_ptr().add(i * 32), acc[i][0]);
        _mm512_storeu_ps(c.as_mut_ptr().add(i * 32 + 16), acc[i][1]);
    }
}
fn main() {
    assert!(
        std::is_x86_feature_detected!("avx512bf16") && std::is_x86_feature_detected!("avx512bw"),
        "this CPU has no AVX512_BF16"
    );
    let a: Vec<f32> = (0..6 * K).map(|i| (i as f32 * 0.1).sin()).collect();
    let b: Vec<f32> = (0..K * 32).map(|i| (i as f32 * 0.07).cos()).collect();
    let a16: Vec<u32> = (0..6 * K / 2)
        .map(|i| {
            let (x0, x1) = (a[2 * i].to_bits() >> 16, a[2 * i + 1].to_bits() >> 16);
            x0 | (x1 << 16)
        })
        .collect();
    let b16: Vec<u16> = (0..K * 32).map(|i| (b[i].to_bits() >> 16) as u16).collect();
    let mut c = vec![0f32; 6 * 32];
    let n = 200_000;
    for _ in 0..5 {
        let t = std::time::Instant::now();
        for _ in 0..n {
            unsafe { f32k(&a, &b, &mut c) };
            std::hint::black_box(&mut c);
        }
        let tf = t.elapsed().as_secs_f64();
        let t = std::time::Instant::now();
        for _ in 0..n {
            unsafe { bf16k(&a16, &b16, &mut c) };
            std::hint::black_box(&mut c);
        }
        let tb = t.elapsed().as_secs_f64();
        let fl = (n * 6 * 32 * K * 2) as f64;
        println!(
            "f32 {:.1} GFLOP/s  bf16 {:.1} GFLOP/s  ratio {:.2}",
            fl / tf / 1e9,
            fl / tb / 1e9,
            tf / tb
        );
    }
}
