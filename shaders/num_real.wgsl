// The number type of a pass written once for two (see shaders/num_dual.wgsl): here plain reals,
// so the pass is the forward (or the backward) itself. A buffer holds NS reals per number.
alias num = real;
const NS: u32 = 1u;

// A number from its value and its tangent (dropped here).
fn npair(v: real, d: real) -> num {
    return v;
}
fn nc(x: real) -> num {
    return x;
}
fn nv(a: num) -> real {
    return a;
}
fn nd(a: num) -> real {
    return real(0);
}
fn nadd(a: num, b: num) -> num {
    return a + b;
}
fn nsub(a: num, b: num) -> num {
    return a - b;
}
fn nmul(a: num, b: num) -> num {
    return a * b;
}
fn ndiv(a: num, b: num) -> num {
    return a / b;
}
fn nscale(a: num, r: real) -> num {
    return a * r;
}
fn nsqrt(a: num) -> num {
    return sqrt_r(a);
}
fn nexp_nonpos(a: num) -> num {
    return exp_nonpos_r(a);
}
