//! The npy format's header, read by hand: for the size check of a file before anything is
//! allocated for it, and to decode the common arrays of floats and integers directly
//! (a general npy reader parses the header as a Python literal, which took more instructions than
//! decoding the data of a small file).

use std::path::Path;

use super::error::DataError;

/// Checks that an npy file holds as many data bytes as its header declares. A malformed header
/// passes: the npy reader then reports it.
pub(super) fn check_npy_size(path: &Path, bytes: &[u8]) -> Result<(), DataError> {
    let Some((header, data_start)) = npy_header(bytes) else {
        return Ok(());
    };
    let (Some(descr), Some(shape)) = (dict_str(header, "descr"), dict_shape(header, "shape"))
    else {
        return Ok(());
    };
    let Some(item) = descr
        .trim_start_matches(['<', '>', '|', '='])
        .get(1..)
        .and_then(|n| n.parse::<u64>().ok())
    else {
        return Ok(());
    };
    let have = (bytes.len() - data_start) as u64;
    let need = shape
        .iter()
        .try_fold(item, |acc, &d| acc.checked_mul(d))
        .map_or("more than 2^64".to_string(), |n| n.to_string());
    if need.parse::<u64>().is_ok_and(|n| n <= have) {
        return Ok(());
    }
    Err(DataError::Invalid {
        path: path.to_path_buf(),
        reason: format!(
            "the npy header declares shape {shape:?} of {descr:?} ({need} bytes of data) but the \
             file holds {have} bytes after its header: it is truncated or damaged"
        ),
    })
}

/// The header text of an npy file and where its data start.
fn npy_header(bytes: &[u8]) -> Option<(&str, usize)> {
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

fn dict_str<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let v = dict_value(header, key)?;
    let q = v.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let v = &v[1..];
    Some(&v[..v.find(q)?])
}

fn dict_shape(header: &str, key: &str) -> Option<Vec<u64>> {
    let v = dict_value(header, key)?.strip_prefix('(')?;
    v[..v.find(')')?]
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| d.parse().ok())
        .collect()
}

/// The values of a C-order npy file of floats or integers (any width, either byte order), as
/// f64 with the shape, when its header is exactly what numpy (or ndarray-npy) writes for one and
/// the data fill the rest; `None` for anything else, which the general reader then reads or
/// names the fault of. Integers and float16 are widened, as DeePMD-kit casts whatever numpy
/// array it loads to its own precision.
pub(super) fn read_numbers(bytes: &[u8]) -> Option<(Vec<usize>, Vec<f64>)> {
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
    let values = decode_items(descr, bytes.get(start..)?, n)?;
    Some((shape, values))
}

/// The `n` items of numpy type `descr` (`<f4`, `|u1`, ...) that fill `data` exactly, widened
/// to f64; `None` when the type is not a number type or `data` is not `n` such items.
pub(super) fn decode_items(descr: &str, data: &[u8], n: usize) -> Option<Vec<f64>> {
    let (order, kind, size) = dtype(descr)?;
    if Some(data.len()) != n.checked_mul(size) {
        return None;
    }
    let values = data
        .chunks_exact(size)
        .map(|item| {
            let mut b = [0u8; 8];
            b[..size].copy_from_slice(item);
            if order == Order::Big {
                b[..size].reverse();
            }
            number(kind, size, u64::from_le_bytes(b))
        })
        .collect();
    Some(values)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Order {
    Little,
    Big,
}

/// Byte order, kind (`f`, `i`, `u`) and item size of an npy `descr` such as `<f4` or `|u1`.
fn dtype(descr: &str) -> Option<(Order, u8, usize)> {
    let b = descr.as_bytes();
    let native = if cfg!(target_endian = "big") {
        Order::Big
    } else {
        Order::Little
    };
    let size: usize = descr.get(2..)?.parse().ok()?;
    let order = match b.first()? {
        b'<' => Order::Little,
        b'>' => Order::Big,
        b'=' => native,
        // "Not applicable": numpy writes it for one-byte items only.
        b'|' if size == 1 => Order::Little,
        _ => return None,
    };
    let kind = *b.get(1)?;
    let ok = match kind {
        b'f' => matches!(size, 2 | 4 | 8),
        b'i' | b'u' => matches!(size, 1 | 2 | 4 | 8),
        _ => false,
    };
    ok.then_some((order, kind, size))
}

/// The value of an item of `size` bytes of `kind`, its bits (little-endian) in `bits`.
fn number(kind: u8, size: usize, bits: u64) -> f64 {
    let signed = |bits: u64| {
        let shift = 64 - 8 * size as u32;
        ((bits << shift) as i64 >> shift) as f64
    };
    match (kind, size) {
        (b'f', 2) => f16(bits as u16),
        (b'f', 4) => f64::from(f32::from_bits(bits as u32)),
        (b'f', _) => f64::from_bits(bits),
        (b'i', _) => signed(bits),
        _ => bits as f64,
    }
}

/// An IEEE half-precision float.
fn f16(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let frac = f64::from(h & 0x3ff);
    sign * match exp {
        0 => frac * 2f64.powi(-24),
        0x1f if frac == 0.0 => f64::INFINITY,
        0x1f => f64::NAN,
        e => (1.0 + frac / 1024.0) * 2f64.powi(e - 15),
    }
}

#[cfg(test)]
mod tests {
    use ndarray::{ArrayD, IxDyn, ShapeBuilder};
    use ndarray_npy::{ReadNpyExt, WriteNpyExt};

    use super::{f16, read_numbers};

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
                read_numbers(&b),
                Some((shape.clone(), want.iter().copied().collect()))
            );
            let b = npy(&a.mapv(|x| x as f32));
            let want = ArrayD::<f32>::read_npy(&b[..]).unwrap();
            assert_eq!(
                read_numbers(&b),
                Some((shape, want.iter().map(|&x| f64::from(x)).collect()))
            );
        }
        // numpy's header ends in ", }" (two of the padding spaces here).
        let b = npy(&ArrayD::from_shape_vec(IxDyn(&[2]), vec![1.5f64, -2.0]).unwrap());
        let at = b.windows(7).position(|w| w == b"(2,)}  ").unwrap();
        let mut numpy = b.clone();
        numpy[at..at + 7].copy_from_slice(b"(2,), }");
        assert_eq!(read_numbers(&numpy).map(|r| r.1), Some(vec![1.5, -2.0]));
        // Fortran order, bytes left over, bytes missing: not for this reader.
        let f = ArrayD::from_shape_vec(IxDyn(&[2, 2]).f(), vec![1.0f64; 4]).unwrap();
        assert_eq!(read_numbers(&npy(&f)), None);
        let mut extra = b.clone();
        extra.push(0);
        assert_eq!(read_numbers(&extra), None);
        assert_eq!(read_numbers(&b[..b.len() - 1]), None);
    }

    /// Integers of every width and sign, either byte order, and float16 are widened to f64.
    #[test]
    fn widens_integers_and_float16() {
        let shape = IxDyn(&[2, 2]);
        let v = [-3i64, 0, 7, 100];
        let f = |a: ArrayD<f64>| Some((vec![2, 2], a.iter().copied().collect::<Vec<_>>()));
        let want = f(ArrayD::from_shape_vec(shape.clone(), v.map(|x| x as f64).to_vec()).unwrap());
        let a = |v: Vec<i64>| ArrayD::from_shape_vec(shape.clone(), v).unwrap();
        assert_eq!(read_numbers(&npy(&a(v.to_vec()))), want);
        assert_eq!(read_numbers(&npy(&a(v.to_vec()).mapv(|x| x as i32))), want);
        assert_eq!(read_numbers(&npy(&a(v.to_vec()).mapv(|x| x as i16))), want);
        assert_eq!(read_numbers(&npy(&a(v.to_vec()).mapv(|x| x as i8))), want);
        let u = a(vec![0, 1, 200, 255]);
        let want_u = Some((vec![2, 2], vec![0.0, 1.0, 200.0, 255.0]));
        assert_eq!(read_numbers(&npy(&u.mapv(|x| x as u8))), want_u);
        assert_eq!(read_numbers(&npy(&u.mapv(|x| x as u64))), want_u);
        // Big-endian int32, as numpy writes `>i4`.
        let mut big = npy(&a(v.to_vec()).mapv(|x| x as i32));
        let at = big.windows(3).position(|w| w == b"<i4").unwrap();
        big[at] = b'>';
        let start = big.len() - 16;
        for item in big[start..].chunks_exact_mut(4) {
            item.reverse();
        }
        assert_eq!(read_numbers(&big), want);
        // float16: 1, -2, 65504 (the largest), 2^-24 (the smallest subnormal).
        let mut h = npy(&a(vec![0; 4]).mapv(|x| x as i16));
        let at = h.windows(3).position(|w| w == b"<i2").unwrap();
        h[at + 1] = b'f';
        let start = h.len() - 8;
        for (item, bits) in h[start..]
            .chunks_exact_mut(2)
            .zip([0x3c00u16, 0xc000, 0x7bff, 0x0001])
        {
            item.copy_from_slice(&bits.to_le_bytes());
        }
        assert_eq!(
            read_numbers(&h),
            Some((vec![2, 2], vec![1.0, -2.0, 65504.0, 2f64.powi(-24)]))
        );
        assert!(f16(0x7e00).is_nan());
        assert_eq!(f16(0xfc00), f64::NEG_INFINITY);
        // Booleans, complex numbers and strings stay the general reader's.
        let mut c = npy(&a(v.to_vec()));
        let at = c.windows(3).position(|w| w == b"<i8").unwrap();
        c[at + 1] = b'c';
        assert_eq!(read_numbers(&c), None);
    }
}
