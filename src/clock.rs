//! Wall-clock helpers. Billing periods are calendar months in UTC.

use time::{Date, Month, OffsetDateTime};

/// Now, Unix milliseconds.
pub fn now_ms() -> i64 {
    let now = OffsetDateTime::now_utc();
    (now.unix_timestamp_nanos() / 1_000_000) as i64
}

fn date_of(ms: i64) -> Date {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
        .date()
}

fn format_date(d: Date) -> String {
    format!("{:04}-{:02}-{:02}", d.year(), u8::from(d.month()), d.day())
}

/// The UTC day of `ms`, `YYYY-MM-DD`.
pub fn day_of(ms: i64) -> String {
    format_date(date_of(ms))
}

/// `ms` as RFC 3339 in UTC with millisecond precision, for people and JSON.
pub fn rfc3339(ms: i64) -> String {
    let t = OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    format!(
        "{}T{:02}:{:02}:{:02}.{:03}Z",
        format_date(t.date()),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

/// The calendar month (UTC) that contains an instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonthPeriod {
    /// `YYYY-MM`.
    pub month: String,
    /// First day, `YYYY-MM-DD`.
    pub first_day: String,
    /// Last day, `YYYY-MM-DD`.
    pub last_day: String,
    /// Start, Unix milliseconds (inclusive).
    pub start_ms: i64,
    /// End, Unix milliseconds (exclusive).
    pub end_ms: i64,
}

/// The month containing `ms`.
pub fn month_of(ms: i64) -> MonthPeriod {
    let d = date_of(ms);
    let first =
        Date::from_calendar_date(d.year(), d.month(), 1).expect("day 1 exists in every month");
    let next = match d.month() {
        Month::December => Date::from_calendar_date(d.year() + 1, Month::January, 1),
        m => Date::from_calendar_date(d.year(), m.next(), 1),
    }
    .expect("day 1 exists in every month");
    let last = next
        .previous_day()
        .expect("the first of a month has a day before it");
    let ms_of = |date: Date| (date.midnight().assume_utc().unix_timestamp()) * 1000;
    MonthPeriod {
        month: format!("{:04}-{:02}", d.year(), u8::from(d.month())),
        first_day: format_date(first),
        last_day: format_date(last),
        start_ms: ms_of(first),
        end_ms: ms_of(next),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_and_months_in_utc() {
        // 2024-02-29T23:59:59.999Z, a leap day.
        let ms = 1_709_251_199_999;
        assert_eq!(day_of(ms), "2024-02-29");
        assert_eq!(day_of(ms + 1), "2024-03-01");
        assert_eq!(rfc3339(ms), "2024-02-29T23:59:59.999Z");
        let m = month_of(ms);
        assert_eq!(
            (m.month.as_str(), m.first_day.as_str(), m.last_day.as_str()),
            ("2024-02", "2024-02-01", "2024-02-29")
        );
        assert_eq!(m.end_ms, ms + 1);
        assert_eq!(month_of(m.start_ms), m);
        let dec = month_of(1_735_689_599_000); // 2024-12-31T23:59:59Z
        assert_eq!(
            (dec.last_day.as_str(), dec.end_ms),
            ("2024-12-31", 1_735_689_600_000)
        );
    }
}
