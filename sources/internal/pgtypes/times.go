package pgtypes

import (
	"errors"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// Dates and timestamps in ISO DateStyle:
//
//	2024-01-02
//	2024-01-02 03:04:05.123456
//	2024-01-02 03:04:05.123456+00        (timestamptz; offsets may be ±hh[:mm[:ss]])
//	0044-03-15 12:00:00+00 BC            (years before 1 AD)
//	10000-01-01 00:00:00                 (years past 9999 have more digits)
//	infinity, -infinity
//
// Years BC are converted to astronomical numbering (1 BC is year 0, 44 BC is
// year -43), which is what time.Date expects.

var errDate = errors.New("invalid date")

// parseDate decodes a date to cdc.Date or cdc.Infinity.
func parseDate(b []byte) (any, error) {
	if inf, ok := parseInfinity(b); ok {
		return inf, nil
	}
	y, m, d, rest, err := parseYMD(b)
	if err != nil {
		return nil, err
	}
	y, rest = applyBC(y, rest)
	if len(rest) != 0 {
		return nil, errDate
	}
	return cdc.Date{Time: time.Date(y, time.Month(m), d, 0, 0, 0, 0, time.UTC)}, nil
}

// parseTimestamp decodes a timestamp to cdc.Timestamp or cdc.Infinity. With
// tz, a UTC offset is required and applied, and the result is in UTC.
func parseTimestamp(b []byte, tz bool) (any, error) {
	if inf, ok := parseInfinity(b); ok {
		return inf, nil
	}
	y, mo, d, rest, err := parseYMD(b)
	if err != nil {
		return nil, err
	}
	if len(rest) < 9 || (rest[0] != ' ' && rest[0] != 'T') || rest[3] != ':' || rest[6] != ':' {
		return nil, errDate
	}
	h, ok1 := digits2(rest[1:])
	mi, ok2 := digits2(rest[4:])
	s, ok3 := digits2(rest[7:])
	if !ok1 || !ok2 || !ok3 || h > 24 || mi > 59 || s > 60 {
		return nil, errDate
	}
	rest = rest[9:]
	ns := 0
	if len(rest) > 0 && rest[0] == '.' {
		n, scale := 0, 0
		i := 1
		for ; i < len(rest) && rest[i] >= '0' && rest[i] <= '9'; i++ {
			if scale < 9 {
				n = n*10 + int(rest[i]-'0')
				scale++
			}
		}
		if i == 1 {
			return nil, errDate
		}
		for ; scale < 9; scale++ {
			n *= 10
		}
		ns = n
		rest = rest[i:]
	}
	off := 0
	if tz {
		if len(rest) < 3 || (rest[0] != '+' && rest[0] != '-') {
			return nil, errors.New("missing UTC offset")
		}
		sign := 1
		if rest[0] == '-' {
			sign = -1
		}
		oh, ok := digits2(rest[1:])
		if !ok {
			return nil, errDate
		}
		off = oh * 3600
		rest = rest[3:]
		for unit := 60; unit >= 1 && len(rest) > 0 && rest[0] == ':'; unit /= 60 {
			v, ok := digits2(rest[1:])
			if !ok || len(rest) < 3 || v > 59 {
				return nil, errDate
			}
			off += v * unit
			rest = rest[3:]
		}
		off *= sign
	}
	y, rest = applyBC(y, rest)
	if len(rest) != 0 {
		return nil, errDate
	}
	t := time.Date(y, time.Month(mo), d, h, mi, s, ns, time.UTC)
	if off != 0 {
		t = t.Add(-time.Duration(off) * time.Second)
	}
	return cdc.Timestamp{Time: t}, nil
}

func parseInfinity(b []byte) (cdc.Infinity, bool) {
	switch string(b) {
	case "infinity":
		return 1, true
	case "-infinity":
		return -1, true
	}
	return 0, false
}

// parseYMD reads "Y+-MM-DD", where the year has at least 4 digits.
func parseYMD(b []byte) (y, m, d int, rest []byte, err error) {
	i := 0
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		if i >= 9 {
			return 0, 0, 0, nil, errDate
		}
		y = y*10 + int(b[i]-'0')
	}
	if i < 4 || len(b) < i+6 || b[i] != '-' || b[i+3] != '-' {
		return 0, 0, 0, nil, errDate
	}
	m, ok1 := digits2(b[i+1:])
	d, ok2 := digits2(b[i+4:])
	if !ok1 || !ok2 || m < 1 || m > 12 || d < 1 || d > 31 {
		return 0, 0, 0, nil, errDate
	}
	return y, m, d, b[i+6:], nil
}

// applyBC turns year y into an astronomical year if rest ends with " BC".
func applyBC(y int, rest []byte) (int, []byte) {
	if len(rest) >= 3 && string(rest[len(rest)-3:]) == " BC" {
		return 1 - y, rest[:len(rest)-3]
	}
	return y, rest
}

func digits2(b []byte) (int, bool) {
	if len(b) < 2 || b[0] < '0' || b[0] > '9' || b[1] < '0' || b[1] > '9' {
		return 0, false
	}
	return int(b[0]-'0')*10 + int(b[1]-'0'), true
}
