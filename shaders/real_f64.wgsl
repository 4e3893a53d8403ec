// Precision prelude for float64, prepended to every op shader (see src/backend/wgpu/shaders.rs).
// Vulkan (GLSL.std.450), Metal and D3D have no f64 transcendentals, so tanh and sqrt are built
// here from f64 arithmetic only; both are accurate to a few ulp.
alias real = f64;
const REAL_IS_F32 = false;

// e^y − 1 for y ≥ 0: y = k·ln2 + r with |r| ≤ ln2/2 (Cody–Waite split: k·LN2_HI is exact for
// k < 2^20), then a degree-13 Taylor polynomial (truncation < 1e-17 relative on that range).
fn expm1_nonneg(y: f64) -> f64 {
    let k = i32(y * 1.4426950408889634 + 0.5);
    let kf = f64(k);
    let r = (y - kf * 6.93147180369123816490e-01) - kf * 1.90821492927058770002e-10;
    var p: f64 = 1.0 / 6227020800.0;
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    let em = p * r;
    if (k == 0) {
        return em;
    }
    // 2^k(1 + em) − 1 = 2^k·em + (2^k − 1): both terms ≥ 0 for k ≥ 1, so nothing cancels.
    // ldexp on f32 is exact for these k (≤ 64), and so is the widening.
    let two_k = f64(ldexp(1.0f, k));
    return two_k * em + (two_k - 1.0);
}

// tanh(x) = em / (em + 2) with em = e^{2|x|} − 1: no cancellation near 0, unlike (e^2x−1)/(e^2x+1)
// with a rounded e^2x. Beyond |x| = 22 tanh is ±1 to f64 precision.
fn tanh_r(x: f64) -> f64 {
    let a = abs(x);
    var t: f64 = 1.0;
    if (a < 22.0) {
        let em = expm1_nonneg(a + a);
        t = em / (em + 2.0);
    }
    return select(t, -t, x < 0.0);
}

// 1/(1 + e^−x) from em = e^|x| − 1: (1 + em)/(2 + em) for x ≥ 0, 1/(2 + em) below. Beyond
// |x| = 80 (where e^|x| would leave expm1_nonneg's f32 powers of two) σ is 1, or 0 for an
// e^x under 2e-35.
fn sigmoid_r(x: f64) -> f64 {
    let em = expm1_nonneg(min(abs(x), 80.0));
    let s = select(1.0 / (2.0 + em), (1.0 + em) / (2.0 + em), x >= 0.0);
    return select(s, 0.0, x < -80.0);
}

// Two Newton steps from the f32 root: the seed has ~1e-7 relative error, the result ~1 ulp.
// The argument is first scaled by even powers of two into f32's normal range.
fn sqrt_r(x: f64) -> f64 {
    if (x <= 0.0) {
        return 0.0;
    }
    var s = x;
    var k: f64 = 1.0;
    for (var i = 0; i < 16 && s < 1e-30; i++) {
        s = s * 18446744073709551616.0;
        k = k * (1.0 / 4294967296.0);
    }
    for (var i = 0; i < 16 && s > 1e30; i++) {
        s = s * (1.0 / 18446744073709551616.0);
        k = k * 4294967296.0;
    }
    var y = f64(sqrt(f32(s)));
    y = 0.5 * (y + s / y);
    y = 0.5 * (y + s / y);
    return y * k;
}

// The per-frame energy sum: plain f64 addition, as on the CPU (the f32 prelude needs more).
struct WideSum {
    s: f64,
}

fn wide_add(acc: ptr<function, WideSum>, x: f64) {
    (*acc).s += x;
}

fn wide_value(acc: ptr<function, WideSum>) -> f64 {
    return (*acc).s;
}

// e^x for x ≤ 0 (a softmax's shifted logits): 1/(1 + (e^−x − 1)), the range past −80 taken in
// steps of e^−80, since expm1_nonneg's powers of two are f32's.
fn exp_nonpos_r(x: f64) -> f64 {
    if (x < -745.0) {
        return 0.0;
    }
    var y = x;
    var s: f64 = 1.0;
    for (var i = 0; i < 10 && y < -80.0; i++) {
        y = y + 80.0;
        s = s * 1.8048513878454153e-35;
    }
    return s / (1.0 + expm1_nonneg(-y));
}
