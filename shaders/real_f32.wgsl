// Precision prelude for float32, prepended to every op shader (see src/backend/wgpu/shaders.rs).
alias real = f32;
const REAL_IS_F32 = true;

// Clamped because some drivers compute tanh as a ratio of exponentials that overflows to NaN;
// tanh(±15) is ±1 in f32 anyway.
fn tanh_r(x: real) -> real {
    return tanh(clamp(x, -15.0, 15.0));
}

// Clamped so that e^−x stays finite (e^80 < f32's largest).
fn sigmoid_r(x: real) -> real {
    return 1.0 / (1.0 + exp(-clamp(x, -80.0, 80.0)));
}

fn sqrt_r(x: real) -> real {
    return sqrt(x);
}

// A sum as accurate as the CPU's f64 accumulation, for the per-frame energy: E is a large sum of
// similar terms and the loss uses E − E_label, which is far smaller. Compensated float tricks
// (TwoSum) do not survive drivers that re-associate float math (Mesa does, as SPIR-V allows), so
// the terms are added exactly as 128-bit two's-complement fixed point, LSB 2^-64 (parts below
// that are dropped; |sum| must stay below 2^62), and rounded to f32 once at the end.
struct WideSum {
    limb: array<u32, 4>,
}

fn wide_add(acc: ptr<function, WideSum>, x: f32) {
    let bits = bitcast<u32>(x);
    let e = i32((bits >> 23u) & 0xffu);
    if (e == 0) {
        // zero or subnormal: below the LSB anyway
        return;
    }
    // |x| = mant · 2^(e − 150) = mant · 2^(sh − 64)
    var mant = (bits & 0x7fffffu) | 0x800000u;
    var sh = e - 150 + 64;
    if (sh < 0) {
        if (sh <= -24) {
            return;
        }
        mant = mant >> u32(-sh);
        sh = 0;
    }
    let k = u32(sh) / 32u;
    let off = u32(sh) % 32u;
    var part = array<u32, 4>();
    if (k < 4u) {
        part[k] = mant << off;
    }
    if (off > 0u && k + 1u < 4u) {
        part[k + 1u] = mant >> (32u - off);
    }
    if ((bits >> 31u) != 0u) {
        // two's-complement negation of the term
        var carry = 1u;
        for (var i = 0u; i < 4u; i++) {
            let v = ~part[i] + carry;
            carry = select(0u, 1u, carry == 1u && v == 0u);
            part[i] = v;
        }
    }
    var carry = 0u;
    for (var i = 0u; i < 4u; i++) {
        let a = (*acc).limb[i];
        let s = a + part[i];
        let s2 = s + carry;
        carry = select(0u, 1u, s < a) + select(0u, 1u, s2 < s);
        (*acc).limb[i] = s2;
    }
}

// The sum, correctly rounded to f32: the top 32 significant bits with a sticky bit for the rest
// go through one (correctly rounded) u32 → f32 conversion.
fn wide_value(acc: ptr<function, WideSum>) -> f32 {
    var l = (*acc).limb;
    let neg = (l[3] >> 31u) != 0u;
    if (neg) {
        var carry = 1u;
        for (var i = 0u; i < 4u; i++) {
            let v = ~l[i] + carry;
            carry = select(0u, 1u, carry == 1u && v == 0u);
            l[i] = v;
        }
    }
    var t = 3;
    while (t >= 0 && l[t] == 0u) {
        t--;
    }
    if (t < 0) {
        return 0.0;
    }
    let lz = countLeadingZeros(l[t]);
    var w = l[t] << lz;
    var sticky = false;
    if (t > 0) {
        if (lz > 0u) {
            w = w | (l[t - 1] >> (32u - lz));
        }
        sticky = (l[t - 1] << lz) != 0u;
        for (var i = 0; i < t - 1; i++) {
            sticky = sticky || l[i] != 0u;
        }
    }
    w = w | select(0u, 1u, sticky);
    let v = ldexp(f32(w), 32 * t - i32(lz) - 64);
    return select(v, -v, neg);
}

// e^x for x ≤ 0 (a softmax's shifted logits), as the f64 prelude's.
fn exp_nonpos_r(x: real) -> real {
    return exp(x);
}
