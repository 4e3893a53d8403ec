// The number type of a pass written once for two (see shaders/num_real.wgsl): here dual numbers
// v + εd, so the forward run on them is the tangent pass and the backward, seeded with Ḋ̄ + εD̄,
// the dual reverse (docs/design.md §3.2, §12; src/backend/cpu/dual.rs is the cpu's). A buffer
// holds NS reals per number, the value then the tangent.
struct num {
    v: real,
    d: real,
}
const NS: u32 = 2u;

fn npair(v: real, d: real) -> num {
    return num(v, d);
}
fn nc(x: real) -> num {
    return num(x, real(0));
}
fn nv(a: num) -> real {
    return a.v;
}
fn nd(a: num) -> real {
    return a.d;
}
fn nadd(a: num, b: num) -> num {
    return num(a.v + b.v, a.d + b.d);
}
fn nsub(a: num, b: num) -> num {
    return num(a.v - b.v, a.d - b.d);
}
fn nmul(a: num, b: num) -> num {
    return num(a.v * b.v, a.d * b.v + a.v * b.d);
}
fn ndiv(a: num, b: num) -> num {
    let q = a.v / b.v;
    return num(q, (a.d - q * b.d) / b.v);
}
fn nscale(a: num, r: real) -> num {
    return num(a.v * r, a.d * r);
}
fn nsqrt(a: num) -> num {
    let s = sqrt_r(a.v);
    return num(s, a.d / (s + s));
}
fn nexp_nonpos(a: num) -> num {
    let e = exp_nonpos_r(a.v);
    return num(e, a.d * e);
}
