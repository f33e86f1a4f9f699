//! The image garbage collector's decisions, apart from IO: which images the
//! node has seen and when they were last used, which of them may go and in
//! which order, and how much to free (upstream's `realImageGCManager`).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// `imageGCHighThresholdPercent` and friends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Image filesystem usage (percent) at which a collection frees space (85).
    pub high_threshold_percent: i32,
    /// The usage a collection frees down to (80).
    pub low_threshold_percent: i32,
    /// An image seen for less than this is never removed (`imageMinimumGCAge`, 2m).
    pub min_age: Duration,
    /// An image unused for longer than this goes whatever the disk says
    /// (`imageMaximumGCAge`; zero: never).
    pub max_age: Duration,
    /// How often a collection runs (upstream's `ImageGCPeriod`, 5 min).
    pub period: Duration,
}

/// Upstream's `ImageGCPeriod`.
pub const PERIOD: Duration = Duration::from_secs(300);

impl Default for Policy {
    fn default() -> Self {
        Self {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            min_age: Duration::from_secs(120),
            max_age: Duration::ZERO,
            period: PERIOD,
        }
    }
}

impl Policy {
    /// Upstream's checks of the configuration, with its messages.
    ///
    /// # Errors
    /// The first rule broken.
    pub fn validate(&self) -> Result<(), String> {
        let (high, low) = (self.high_threshold_percent, self.low_threshold_percent);
        if !(0..=100).contains(&high) {
            return Err(format!(
                "invalid configuration: imageGCHighThresholdPercent (--image-gc-high-threshold) {high} must be between 0 and 100, inclusive"
            ));
        }
        if !(0..=100).contains(&low) {
            return Err(format!(
                "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) {low} must be between 0 and 100, inclusive"
            ));
        }
        if low >= high {
            return Err(format!(
                "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) {low} must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) {high}"
            ));
        }
        if !self.max_age.is_zero() && self.min_age > self.max_age {
            return Err(format!(
                "invalid configuration: imageMaximumGCAge {:?} must be greater than imageMinimumGCAge {:?}",
                self.max_age, self.min_age
            ));
        }
        Ok(())
    }

    /// Upstream turns image GC off when the high threshold is 100 and no
    /// maximum age is set.
    pub fn enabled(&self) -> bool {
        self.high_threshold_percent < 100 || !self.max_age.is_zero()
    }

    /// The bytes a collection frees, when the image filesystem's usage is at or
    /// over the high threshold: down to the low threshold.
    pub fn amount_to_free(&self, capacity: u64, available: u64) -> Option<u64> {
        if capacity == 0 {
            return None;
        }
        let available = available.min(capacity);
        let usage = 100 - available.saturating_mul(100) / capacity;
        let usage = i64::try_from(usage).unwrap_or(i64::MAX);
        if usage < i64::from(self.high_threshold_percent) {
            return None;
        }
        let low_free = u128::try_from(100 - self.low_threshold_percent).unwrap_or(0);
        let keep_free = u64::try_from(u128::from(capacity) * low_free / 100).unwrap_or(u64::MAX);
        Some(keep_free.saturating_sub(available))
    }
}

/// An image as the runtime lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The image ID (`sha256:…`).
    pub id: String,
    /// Its size in bytes.
    pub size: u64,
    /// The runtime pinned it (containerd pins its sandbox image), or evlet
    /// protects it (the pod infra image).
    pub pinned: bool,
}

/// What the collector knows of one image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// When evlet first saw it.
    pub first_detected: Instant,
    /// When a container last used it; None: not since evlet started.
    pub last_used: Option<Instant>,
    /// Its size in bytes.
    pub size: u64,
    /// Never removed.
    pub pinned: bool,
}

/// An image that may be removed, in removal order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The image ID.
    pub id: String,
    /// What is known of it.
    pub record: Record,
}

/// The images the node has, as upstream's `imageRecords`.
#[derive(Debug, Default)]
pub struct Records(HashMap<String, Record>);

impl Records {
    /// Upstream's `detectImages`: records images seen for the first time at
    /// `now`, marks those `in_use` (by any container, running or not) as used
    /// now, and forgets images that are gone.
    pub fn detect(&mut self, images: &[Image], in_use: &HashSet<String>, now: Instant) {
        let present: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        self.0.retain(|id, _| present.contains(id.as_str()));
        for image in images {
            let record = self.0.entry(image.id.clone()).or_insert(Record {
                first_detected: now,
                last_used: None,
                size: 0,
                pinned: false,
            });
            if in_use.contains(&image.id) {
                record.last_used = Some(now);
            }
            record.size = image.size;
            record.pinned = image.pinned;
        }
    }

    /// Forgets a removed image.
    pub fn forget(&mut self, id: &str) {
        self.0.remove(id);
    }

    /// The images neither in use nor pinned, least recently used first (never
    /// used before those used), ties broken by first detection.
    pub fn eviction_order(&self, in_use: &HashSet<String>) -> Vec<Candidate> {
        let mut order: Vec<Candidate> = self
            .0
            .iter()
            .filter(|(id, r)| !r.pinned && !in_use.contains(id.as_str()))
            .map(|(id, r)| Candidate {
                id: id.clone(),
                record: *r,
            })
            .collect();
        order.sort_by(|a, b| {
            (a.record.last_used, a.record.first_detected, &a.id).cmp(&(
                b.record.last_used,
                b.record.first_detected,
                &b.id,
            ))
        });
        order
    }

    /// How many images are known.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// No image is known.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Upstream's `freeOldImages` test: with a maximum age, once the collector has
/// run that long, an image unused (or unseen in use) for longer goes.
pub fn too_old(c: &Candidate, policy: &Policy, now: Instant, began: Instant) -> bool {
    if policy.max_age.is_zero() || now.duration_since(began) <= policy.max_age {
        return false;
    }
    let since = c.record.last_used.unwrap_or(c.record.first_detected);
    now.duration_since(since) > policy.max_age
}

/// Upstream's `freeSpace` test: an image seen for less than the minimum age
/// may have just been pulled for a container about to start; it stays.
pub fn old_enough(c: &Candidate, policy: &Policy, now: Instant) -> bool {
    now.duration_since(c.record.first_detected) >= policy.min_age
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(id: &str, size: u64) -> Image {
        Image {
            id: id.into(),
            size,
            pinned: false,
        }
    }

    #[test]
    fn upstreams_rules_and_messages_check_the_configuration() {
        assert_eq!(Policy::default().validate(), Ok(()));
        let bad = |high, low, min: u64, max: u64| {
            Policy {
                high_threshold_percent: high,
                low_threshold_percent: low,
                min_age: Duration::from_secs(min),
                max_age: Duration::from_secs(max),
                period: PERIOD,
            }
            .validate()
            .expect_err("invalid")
        };
        assert_eq!(
            bad(101, 80, 0, 0),
            "invalid configuration: imageGCHighThresholdPercent (--image-gc-high-threshold) 101 must be between 0 and 100, inclusive"
        );
        assert!(bad(85, -1, 0, 0).contains(
            "imageGCLowThresholdPercent (--image-gc-low-threshold) -1 must be between 0 and 100"
        ));
        assert_eq!(
            bad(80, 80, 0, 0),
            "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) 80 must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) 80"
        );
        assert_eq!(
            bad(85, 80, 600, 60),
            "invalid configuration: imageMaximumGCAge 60s must be greater than imageMinimumGCAge 600s"
        );
    }

    #[test]
    fn gc_is_off_only_at_100_percent_without_a_maximum_age() {
        let mut p = Policy {
            high_threshold_percent: 100,
            low_threshold_percent: 80,
            ..Policy::default()
        };
        assert!(!p.enabled());
        p.max_age = Duration::from_secs(3600);
        assert!(p.enabled());
        assert!(Policy::default().enabled());
    }

    #[test]
    fn over_the_high_threshold_frees_down_to_the_low_one() {
        let p = Policy::default();
        // 84 % used: nothing.
        assert_eq!(p.amount_to_free(1000, 160), None);
        // 85 % used: down to 80 %, 200 bytes free.
        assert_eq!(p.amount_to_free(1000, 150), Some(50));
        assert_eq!(p.amount_to_free(1000, 0), Some(200));
        // More available than capacity counts as empty.
        assert_eq!(p.amount_to_free(1000, 5000), None);
        assert_eq!(p.amount_to_free(0, 0), None);
        // No overflow on a large filesystem.
        let cap = 1_u64 << 50;
        assert_eq!(p.amount_to_free(cap, 0), Some(cap / 5));
    }

    #[test]
    fn used_and_pinned_images_never_go_and_the_rest_go_least_recently_used_first() {
        let t0 = Instant::now();
        let mut r = Records::default();
        let images = [
            image("used", 1),
            image("old", 2),
            image("newer", 3),
            Image {
                pinned: true,
                ..image("pause", 4)
            },
        ];
        // t0: "old" in use; t1: "newer" in use; t2: only "used" in use.
        r.detect(&images, &HashSet::from(["old".into()]), t0);
        let t1 = t0 + Duration::from_secs(10);
        r.detect(&images, &HashSet::from(["newer".into()]), t1);
        let t2 = t1 + Duration::from_secs(10);
        let in_use = HashSet::from(["used".into()]);
        r.detect(&images, &in_use, t2);
        let order: Vec<String> = r
            .eviction_order(&in_use)
            .into_iter()
            .map(|c| c.id)
            .collect();
        assert_eq!(order, ["old", "newer"]);
        // An image that disappears is forgotten; a new one is never-used, so first.
        let t3 = t2 + Duration::from_secs(10);
        r.detect(
            &[image("used", 1), image("newer", 3), image("fresh", 5)],
            &in_use,
            t3,
        );
        assert_eq!(r.len(), 3);
        let order: Vec<String> = r
            .eviction_order(&in_use)
            .into_iter()
            .map(|c| c.id)
            .collect();
        assert_eq!(order, ["fresh", "newer"]);
    }

    #[test]
    fn minimum_and_maximum_ages_as_upstream() {
        let began = Instant::now();
        let p = Policy {
            min_age: Duration::from_secs(120),
            max_age: Duration::from_secs(3600),
            ..Policy::default()
        };
        let c = Candidate {
            id: "x".into(),
            record: Record {
                first_detected: began,
                last_used: Some(began + Duration::from_secs(60)),
                size: 1,
                pinned: false,
            },
        };
        assert!(!old_enough(&c, &p, began + Duration::from_secs(119)));
        assert!(old_enough(&c, &p, began + Duration::from_secs(120)));
        // Not before the collector has run for the maximum age.
        assert!(!too_old(&c, &p, began + Duration::from_secs(3600), began));
        assert!(!too_old(&c, &p, began + Duration::from_secs(3660), began));
        assert!(too_old(&c, &p, began + Duration::from_secs(3661), began));
        let off = Policy {
            max_age: Duration::ZERO,
            ..p
        };
        assert!(!too_old(
            &c,
            &off,
            began + Duration::from_secs(1 << 20),
            began
        ));
    }
}
