package bench

import (
	"math"
	"slices"
)

// Summary is the spread of one measurement over its repetitions. The
// values stay in the order they were measured so that drift is visible in
// results.json.
type Summary struct {
	Median float64   `json:"median"`
	Min    float64   `json:"min"`
	Max    float64   `json:"max"`
	Values []float64 `json:"values"`
}

// Summarize reports median, min and max of vs; NaN values (a repetition
// that measured nothing) are left out of the statistics but kept in Values.
func Summarize(vs []float64) Summary {
	s := Summary{Values: slices.Clone(vs), Median: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	var ok []float64
	for _, v := range vs {
		if !math.IsNaN(v) {
			ok = append(ok, v)
		}
	}
	if len(ok) == 0 {
		return s
	}
	slices.Sort(ok)
	s.Min, s.Max = ok[0], ok[len(ok)-1]
	if n := len(ok); n%2 == 1 {
		s.Median = ok[n/2]
	} else {
		s.Median = (ok[n/2-1] + ok[n/2]) / 2
	}
	return s
}

// Percentile is the nearest-rank percentile p (0-100) of vs, NaN when vs
// is empty. Nearest rank never reports a value that was not observed.
func Percentile(vs []float64, p float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	rank = min(max(rank, 1), len(s))
	return s[rank-1]
}
