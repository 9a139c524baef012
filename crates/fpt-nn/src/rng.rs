//! A small, seedable, serialisable random number generator (xoshiro256++ seeded by
//! SplitMix64). Every random number of a run (weights, data, dropout) comes from one of
//! these, so a run is a pure function of its seed on CPU, and the state can be saved in a
//! checkpoint.

use serde::{Deserialize, Serialize};

/// xoshiro256++ generator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rng {
    s: [u64; 4],
}

fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let s = [
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
        ];
        Self { s }
    }

    /// Stream number `index` of a family seeded by `seed`: the streams of one seed are
    /// independent of each other, so pieces of one random tensor (a dropout mask's chunks,
    /// one attention head's mask) can be drawn in parallel and drawn again identically.
    pub fn stream(seed: u64, index: u64) -> Self {
        let mut z = seed ^ index.wrapping_add(1).wrapping_mul(0xD6E8_FEB8_6659_FD93);
        z = (z ^ (z >> 32)).wrapping_mul(0xD6E8_FEB8_6659_FD93);
        Rng::new(z ^ (z >> 29))
    }

    /// An independent stream derived from this generator's seed material and a label, e.g.
    /// `rng.fork("data")`. Does not advance `self`.
    pub fn fork(&self, label: &str) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in label.bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        Rng::new(self.s[0] ^ self.s[2].rotate_left(17) ^ h)
    }

    /// Sub-stream `index` of this generator (e.g. one per epoch of a data order), from its
    /// next output and the index; does not advance `self`.
    pub fn substream(&self, index: u64) -> Self {
        let k = self.clone().next_u64();
        Rng::new(k ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[0]
            .wrapping_add(self.s[3])
            .rotate_left(23)
            .wrapping_add(self.s[0]);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [0, 1) as f32 (24 random bits).
    pub fn uniform_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// Uniform integer in `0..n` (`n > 0`), without modulo bias.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "Rng::below(0)");
        // Lemire's multiply-shift with rejection.
        loop {
            let x = self.next_u64();
            let m = (x as u128) * (n as u128);
            let l = m as u64;
            if l >= n.wrapping_neg() % n {
                return (m >> 64) as u64;
            }
        }
    }

    /// One fair random bit.
    pub fn bit(&mut self) -> bool {
        self.next_u64() >> 63 == 1
    }

    /// A standard normal sample (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        loop {
            let u1 = self.uniform();
            if u1 > 0.0 {
                let u2 = self.uniform();
                return (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            }
        }
    }

    /// `n` samples of N(mean, std) as f32, two per Box-Muller draw.
    pub fn normal_vec(&mut self, n: usize, mean: f64, std: f64) -> Vec<f32> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let u1 = self.uniform();
            if u1 <= 0.0 {
                continue;
            }
            let u2 = self.uniform();
            let r = (-2.0 * u1.ln()).sqrt();
            let (s, c) = (std::f64::consts::TAU * u2).sin_cos();
            out.push((mean + std * r * c) as f32);
            if out.len() < n {
                out.push((mean + std * r * s) as f32);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_state_round_trips() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..10 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let saved = serde_json::to_string(&a).unwrap();
        let mut c: Rng = serde_json::from_str(&saved).unwrap();
        assert_eq!(a.next_u64(), c.next_u64());
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    }

    #[test]
    fn normal_has_unit_moments() {
        let v = Rng::new(3).normal_vec(200_000, 0.0, 1.0);
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.01, "var {var}");
        let mut r = Rng::new(4);
        let mut counts = [0usize; 3];
        for _ in 0..30_000 {
            counts[r.below(3) as usize] += 1;
        }
        for c in counts {
            assert!((9_500..10_500).contains(&c), "{counts:?}");
        }
    }
}
