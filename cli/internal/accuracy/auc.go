// Package accuracy is MLPerf's accuracy rule for the table and dense
// precisions, on synthetic labels: the seeded model has no data set, so
// labels are drawn once from the float32 model's own scores (fp32 tables,
// fp32 dense weights), through a calibration that gives float32 the AUC
// Criteo's data gives DLRMv2 (0.80), and every combination of precisions
// is scored against those same labels. A combination then loses AUC
// exactly where rounding reorders examples float32 ranks apart, which is
// what MLPerf's 99 % and 99.9 % targets bound.
package accuracy

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// ranks2 returns twice the midrank (1-based) of each score: examples with
// equal scores share the mean of the ranks they span, so a tie counts half
// a concordant pair. Twice it is an integer, which keeps AUC exact.
func ranks2(scores []float32) ([]int64, error) {
	idx := make([]int32, len(scores))
	for i, s := range scores {
		if s != s {
			return nil, fmt.Errorf("accuracy: score %d is NaN", i)
		}
		idx[i] = int32(i)
	}
	slices.SortFunc(idx, func(a, b int32) int {
		return cmp.Or(cmp.Compare(scores[a], scores[b]), cmp.Compare(a, b))
	})
	r := make([]int64, len(scores))
	for lo := 0; lo < len(idx); {
		hi := lo + 1
		for hi < len(idx) && scores[idx[hi]] == scores[idx[lo]] {
			hi++
		}
		// Ranks lo+1 … hi: twice their mean is lo+1+hi.
		for _, i := range idx[lo:hi] {
			r[i] = int64(lo + 1 + hi)
		}
		lo = hi
	}
	return r, nil
}

// errOneClass is returned for labels that are all positive or all negative,
// for which AUC is undefined.
var errOneClass = errors.New("accuracy: AUC needs both positive and negative labels")

// aucFromRanks is the Mann–Whitney form of AUC: the positives' rank sum
// less its least possible value, over the number of (positive, negative)
// pairs, all in integers until the one division.
func aucFromRanks(r2 []int64, labels []bool) (float64, error) {
	var pos, sum2 int64
	for i, y := range labels {
		if y {
			pos++
			sum2 += r2[i]
		}
	}
	neg := int64(len(labels)) - pos
	if pos == 0 || neg == 0 {
		return 0, errOneClass
	}
	return float64(sum2-pos*(pos+1)) / float64(2*pos*neg), nil
}

// AUC returns the exact area under the ROC curve of scores against labels:
// the fraction of (positive, negative) pairs the scores order correctly,
// a tie counting half.
func AUC(scores []float32, labels []bool) (float64, error) {
	if len(scores) != len(labels) {
		return 0, fmt.Errorf("accuracy: %d scores and %d labels", len(scores), len(labels))
	}
	r2, err := ranks2(scores)
	if err != nil {
		return 0, err
	}
	return aucFromRanks(r2, labels)
}

// Calibration maps a float32 score s to the probability that its label is
// positive: sigmoid(K·(logit(s) − C)). C is the median logit, so about
// half the labels are positive (the most pairs for the examples drawn); K
// sets how well the scores can predict the labels, so it sets the AUC.
type Calibration struct {
	K, C float64
	// AUC is float32's AUC on the labels this calibration draws.
	AUC float64
}

// logit of a float32 probability, held inside (0, 1) so a saturated
// score stays finite.
func logit(s float32) float64 {
	p := min(max(float64(s), 1e-12), 1-1e-12)
	return math.Log(p / (1 - p))
}

func sigmoid(z float64) float64 {
	if z >= 0 {
		return 1 / (1 + math.Exp(-z))
	}
	ez := math.Exp(z)
	return ez / (1 + ez)
}

// Uniforms returns the n uniforms in [0, 1) that labels are drawn with:
// label i is positive when uniform i is below its probability. They are
// drawn once from seed, so every calibration tried, and every precision,
// sees the same draw.
func Uniforms(seed uint64, n int) []float64 {
	rng := rand.New(rand.NewPCG(seed, 0x6c6162656c73)) // "labels"
	u := make([]float64, n)
	for i := range u {
		u[i] = rng.Float64()
	}
	return u
}

// Labels draws the labels of scores through c with the uniforms u.
func (c Calibration) Labels(scores []float32, u []float64) []bool {
	y := make([]bool, len(scores))
	for i, s := range scores {
		y[i] = u[i] < sigmoid(c.K*(logit(s)-c.C))
	}
	return y
}

// Calibrate returns the calibration whose labels, drawn with u, give the
// float32 scores an AUC within tol of target. K is found by bisection on
// that realized AUC (0 at K = 0, where every label is a coin flip, and
// near 1 as K grows and the labels become the scores above the median), so
// the result is a function of the scores and u alone.
func Calibrate(scores []float32, u []float64, target, tol float64) (Calibration, error) {
	if len(u) != len(scores) {
		return Calibration{}, fmt.Errorf("accuracy: %d scores and %d uniforms", len(scores), len(u))
	}
	if len(scores) < 2 {
		return Calibration{}, fmt.Errorf("accuracy: calibrating needs at least 2 examples, got %d", len(scores))
	}
	r2, err := ranks2(scores)
	if err != nil {
		return Calibration{}, err
	}
	logits := make([]float64, len(scores))
	for i, s := range scores {
		logits[i] = logit(s)
	}
	sorted := slices.Sorted(slices.Values(logits))
	c := Calibration{C: sorted[len(sorted)/2]}
	labels := make([]bool, len(scores))
	at := func(k float64) float64 {
		for i, z := range logits {
			labels[i] = u[i] < sigmoid(k*(z-c.C))
		}
		a, err := aucFromRanks(r2, labels)
		if err != nil {
			return 0.5 // one class: no information, as at K = 0
		}
		return a
	}
	// The scores' logits may span anything from 1e-3 to 10, so K's range
	// is found by doubling before it is bisected.
	lo, hi := 0.0, 1.0
	aLo, aHi := at(lo), at(hi)
	for aHi < target {
		if hi > 1e12 {
			return Calibration{}, fmt.Errorf("accuracy: no calibration reaches AUC %.3f (the scores rank no better than %.4f)", target, aHi)
		}
		lo, aLo = hi, aHi
		hi *= 2
		aHi = at(hi)
	}
	for range 100 {
		if math.Abs(aHi-target) <= tol/10 {
			break
		}
		mid := (lo + hi) / 2
		if a := at(mid); a < target {
			lo, aLo = mid, a
		} else {
			hi, aHi = mid, a
		}
	}
	c.K, c.AUC = hi, aHi
	if math.Abs(aLo-target) < math.Abs(aHi-target) {
		c.K, c.AUC = lo, aLo
	}
	if math.Abs(c.AUC-target) > tol {
		return c, fmt.Errorf("accuracy: the closest calibration (K=%g) gives AUC %.4f, outside %.3f ± %.3f", c.K, c.AUC, target, tol)
	}
	return c, nil
}
