//! The npy format's header, read by hand: for the size check of a file before anything is
//! allocated for it, and to decode the common little-endian float32/float64 arrays directly
//! (a general npy reader parses the header as a Python literal, which took more instructions than
//! decoding the data of a small file).

/// The header text of an npy file and where its data start.
pub(super) fn npy_header(bytes: &[u8]) -> Option<(&str, usize)> {
    if bytes.get(..6)? != b"\x93NUMPY" {
        return None;
    }
    let (len, start) = match bytes.get(6)? {
        1 => (
            u16::from_le_bytes(bytes.get(8..10)?.try_into().ok()?) as usize,
            10usize,
        ),
        _ => (
            u32::from_le_bytes(bytes.get(8..12)?.try_into().ok()?) as usize,
            12,
        ),
    };
    let end = len.checked_add(start)?;
    Some((std::str::from_utf8(bytes.get(start..end)?).ok()?, end))
}

/// The text after `'key':` in a Python dict literal.
fn dict_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = header.find(&format!("'{key}'"))?;
    let rest = header[at + key.len() + 2..].trim_start();
    Some(rest.strip_prefix(':')?.trim_start())
}

pub(super) fn dict_str<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let v = dict_value(header, key)?;
    let q = v.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let v = &v[1..];
    Some(&v[..v.find(q)?])
}

pub(super) fn dict_shape(header: &str, key: &str) -> Option<Vec<u64>> {
    let v = dict_value(header, key)?.strip_prefix('(')?;
    v[..v.find(')')?]
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| d.parse().ok())
        .collect()
}

/// The values of a C-order little-endian float32/float64 npy file, as f64 with the shape, when
/// its header is exactly what numpy (or ndarray-npy) writes for one and the data fill the rest;
/// `None` for anything else, which the general reader then reads or names the fault of.
pub(super) fn read_le_floats(bytes: &[u8]) -> Option<(Vec<usize>, Vec<f64>)> {
    let (header, start) = npy_header(bytes)?;
    let descr = dict_str(header, "descr")?;
    let shape: Vec<usize> = dict_shape(header, "shape")?
        .into_iter()
        .map(|d| usize::try_from(d).ok())
        .collect::<Option<_>>()?;
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let dims = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {dims}");
    let rest = header.trim_end().strip_prefix(&dict)?;
    if rest != "}" && rest != ", }" {
        return None;
    }
    let n = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))?;
    // Exactly the data: a file with bytes left over is the general reader's error.
    let data = |item: usize| {
        let data = bytes.get(start..)?;
        (Some(data.len()) == n.checked_mul(item)).then_some(data)
    };
    let values = match descr {
        "<f8" => data(8)?
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect(),
        "<f4" => data(4)?
            .chunks_exact(4)
            .map(|b| f64::from(f32::from_le_bytes(b.try_into().expect("4 bytes"))))
            .collect(),
        _ => return None,
    };
    Some((shape, values))
}

#[cfg(test)]
mod tests {
    use ndarray::{ArrayD, IxDyn, ShapeBuilder};
    use ndarray_npy::{ReadNpyExt, WriteNpyExt};

    use super::read_le_floats;

    fn npy<A: ndarray_npy::WritableElement>(a: &ArrayD<A>) -> Vec<u8> {
        let mut out = Vec::new();
        a.write_npy(&mut out).unwrap();
        out
    }

    /// The values and shapes the general reader gives, for the files ndarray-npy and numpy
    /// write; anything else is left to it.
    #[test]
    fn reads_what_the_general_reader_reads() {
        for shape in [vec![], vec![3], vec![2, 3], vec![2, 0, 3]] {
            let n: usize = shape.iter().product();
            let a = ArrayD::from_shape_vec(IxDyn(&shape), (0..n).map(|i| i as f64 / 7.0).collect())
                .unwrap();
            let b = npy(&a);
            let want = ArrayD::<f64>::read_npy(&b[..]).unwrap();
            assert_eq!(
                read_le_floats(&b),
                Some((shape.clone(), want.iter().copied().collect()))
            );
            let b = npy(&a.mapv(|x| x as f32));
            let want = ArrayD::<f32>::read_npy(&b[..]).unwrap();
            assert_eq!(
                read_le_floats(&b),
                Some((shape, want.iter().map(|&x| f64::from(x)).collect()))
            );
        }
        // numpy's header ends in ", }" (two of the padding spaces here).
        let b = npy(&ArrayD::from_shape_vec(IxDyn(&[2]), vec![1.5f64, -2.0]).unwrap());
        let at = b.windows(7).position(|w| w == b"(2,)}  ").unwrap();
        let mut numpy = b.clone();
        numpy[at..at + 7].copy_from_slice(b"(2,), }");
        assert_eq!(read_le_floats(&numpy).map(|r| r.1), Some(vec![1.5, -2.0]));
        // Fortran order, integers, bytes left over, bytes missing: not for this reader.
        let f = ArrayD::from_shape_vec(IxDyn(&[2, 2]).f(), vec![1.0f64; 4]).unwrap();
        assert_eq!(read_le_floats(&npy(&f)), None);
        assert_eq!(
            read_le_floats(&npy(&ArrayD::from_elem(IxDyn(&[2]), 1i64))),
            None
        );
        let mut extra = b.clone();
        extra.push(0);
        assert_eq!(read_le_floats(&extra), None);
        assert_eq!(read_le_floats(&b[..b.len() - 1]), None);
    }
}
