package filter

import (
	"bytes"
	"math"
)

// Timestamps are microseconds since 2000-01-01 00:00:00 UTC, as PostgreSQL
// keeps them (the range of PostgreSQL's timestamps fits int64 only from
// that epoch); infinity and -infinity are the largest and smallest int64,
// as in PostgreSQL.

// parseTimestamp reads a timestamp as the decoder writes it — RFC 3339
// ("2026-11-29T23:21:24.123456Z", no zone for timestamp), or PostgreSQL's
// ISO text for years past 9999 and BC dates ("10000-01-01 00:00:00+00",
// "0044-03-15 12:00:00+00 BC"), or infinity and -infinity. With strict
// (a filter's value) the year has four digits, the separator is T and the
// fields are checked against the calendar. zone reports an offset or Z.
func parseTimestamp(s []byte, strict bool) (us int64, zone bool, ok bool) {
	if us, ok := fastTimestamp(s); ok {
		return us, true, true
	}
	switch {
	case bytes.EqualFold(s, []byte("infinity")), bytes.EqualFold(s, []byte("+infinity")):
		return math.MaxInt64, false, true
	case bytes.EqualFold(s, []byte("-infinity")):
		return math.MinInt64, false, true
	}
	i := 0
	num := func(min, max int) (int64, bool) {
		j := i
		var v int64
		for i < len(s) && s[i] >= '0' && s[i] <= '9' && i-j < max {
			v = v*10 + int64(s[i]-'0')
			i++
		}
		return v, i-j >= min
	}
	lit := func(c byte) bool {
		if i < len(s) && s[i] == c {
			i++
			return true
		}
		return false
	}
	yMax := 7
	if strict {
		yMax = 4
	}
	year, ok1 := num(4, yMax)
	if !ok1 || !lit('-') {
		return 0, false, false
	}
	month, ok2 := num(2, 2)
	if !ok2 || !lit('-') {
		return 0, false, false
	}
	day, ok3 := num(2, 2)
	if !ok3 || i >= len(s) {
		return 0, false, false
	}
	switch c := s[i]; {
	case c == 'T' || c == 't' || !strict && c == ' ':
		i++
	default:
		return 0, false, false
	}
	hour, ok4 := num(2, 2)
	if !ok4 || !lit(':') {
		return 0, false, false
	}
	minute, ok5 := num(2, 2)
	if !ok5 || !lit(':') {
		return 0, false, false
	}
	sec, ok6 := num(2, 2)
	if !ok6 {
		return 0, false, false
	}
	var frac int64
	if lit('.') {
		j := i
		f, okf := num(1, 6)
		if !okf || i < len(s) && s[i] >= '0' && s[i] <= '9' {
			return 0, false, false
		}
		for n := i - j; n < 6; n++ {
			f *= 10
		}
		frac = f
	}
	var offset int64 // seconds east of UTC
	if i < len(s) {
		switch s[i] {
		case 'Z', 'z':
			i++
			zone = true
		case '+', '-':
			sign := int64(1)
			if s[i] == '-' {
				sign = -1
			}
			i++
			zone = true
			oh, okh := num(2, 2)
			if !okh {
				return 0, false, false
			}
			var om, os int64
			if lit(':') || !strict && i < len(s) && s[i] >= '0' && s[i] <= '9' {
				var okm bool
				if om, okm = num(2, 2); !okm {
					return 0, false, false
				}
				if !strict && lit(':') {
					var oks bool
					if os, oks = num(2, 2); !oks {
						return 0, false, false
					}
				}
			} else if strict {
				return 0, false, false
			}
			if oh > 15 || om > 59 || os > 59 {
				return 0, false, false
			}
			offset = sign * (oh*3600 + om*60 + os)
		}
	}
	if !strict && i+3 == len(s) && string(s[i:]) == " BC" {
		i += 3
		year = 1 - year // astronomical numbering: 1 BC is year 0
	}
	if i != len(s) {
		return 0, false, false
	}
	if month < 1 || month > 12 || day < 1 || day > daysIn(year, month) || hour > 23 || minute > 59 || sec > 59 {
		return 0, false, false
	}
	days := daysFromCivil(year, month, day) - daysFromCivil(2000, 1, 1)
	us = ((days*24+hour)*60+minute)*60 + sec - offset
	if us > math.MaxInt64/1_000_000-1 || us < math.MinInt64/1_000_000+1 {
		return 0, false, false
	}
	return us*1_000_000 + frac, zone, true
}

func daysIn(y, m int64) int64 {
	switch m {
	case 2:
		if y%4 == 0 && (y%100 != 0 || y%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

// daysFromCivil counts days from 1970-01-01 to y-m-d in the proleptic
// Gregorian calendar, y astronomical (H. Hinnant's algorithm).
func daysFromCivil(y, m, d int64) int64 {
	if m <= 2 {
		y--
	}
	era := y
	if era < 0 {
		era -= 399
	}
	era /= 400
	yoe := y - era*400
	mp := (m + 9) % 12
	doy := (153*mp+2)/5 + d - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return era*146097 + doe - 719468
}

// fastTimestamp reads the form the decoder writes for nearly every
// timestamptz, "2026-11-29T23:21:24.123456Z", without the general parser.
func fastTimestamp(s []byte) (int64, bool) {
	if len(s) != 27 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' || s[19] != '.' || s[26] != 'Z' {
		return 0, false
	}
	var f [8]int64
	for k, r := range [8][2]int{{0, 4}, {5, 7}, {8, 10}, {11, 13}, {14, 16}, {17, 19}, {20, 26}} {
		var v int64
		for _, c := range s[r[0]:r[1]] {
			if c < '0' || c > '9' {
				return 0, false
			}
			v = v*10 + int64(c-'0')
		}
		f[k] = v
	}
	year, month, day, hour, minute, sec, frac := f[0], f[1], f[2], f[3], f[4], f[5], f[6]
	if month < 1 || month > 12 || day < 1 || day > daysIn(year, month) || hour > 23 || minute > 59 || sec > 59 {
		return 0, false
	}
	days := daysFromCivil(year, month, day) - daysFromCivil(2000, 1, 1)
	return (((days*24+hour)*60+minute)*60+sec)*1_000_000 + frac, true
}
