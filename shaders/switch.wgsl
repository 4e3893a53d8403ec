// The switch of the environment matrix, shared by env_mat.wgsl and attn.wgsl (DPA-1's σ), put
// after the shaders that call it (see src/backend/wgpu/shaders.rs).

// The C2-smooth quintic switch and its r-derivative.
fn switch_fn(r: real, rcut: real, rsm: real) -> vec2<real> {
    if (r <= rsm) {
        return vec2<real>(real(1), real(0));
    }
    if (r >= rcut) {
        return vec2<real>(real(0), real(0));
    }
    let w = rcut - rsm;
    let x = (r - rsm) / w;
    if (REAL_IS_F32) {
        // From rcut's side, sw = S(y) with y = 1 − x and S(y) = y³(6y² − 15y + 10): near rcut
        // the form below is 1 − (1 − sw) with sw far below f32's epsilon, and DPA-1's r̂ = R̂[1:4]/|R̂[1:4]|
        // of a neighbour at the cut would flip or vanish (its attn_dotr gate is not damped by
        // sw). The cpu's f32 takes the env mat in f64, so both then agree.
        let y = (rcut - r) / w;
        let sw = y * y * y * (real(6) * y * y - real(15) * y + real(10));
        return vec2<real>(sw, real(-30) * x * x * y * y / w);
    }
    // f64 keeps the cpu's (DeePMD-kit's) formula, so the wgpu step equals the cpu's bit for bit.
    let poly = real(-6) * x * x + real(15) * x - real(10);
    let sw = x * x * x * poly + real(1);
    let dsw = (real(3) * x * x * poly + x * x * x * (real(-12) * x + real(15))) / w;
    return vec2<real>(sw, dsw);
}
