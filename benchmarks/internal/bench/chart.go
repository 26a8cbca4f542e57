package bench

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

var palette = []color.RGBA{
	{0xd6, 0x27, 0x28, 0xff},
	{0x1f, 0x77, 0xb4, 0xff},
	{0x2c, 0xa0, 0x2c, 0xff},
	{0xff, 0x7f, 0x0e, 0xff},
	{0x94, 0x67, 0xbd, 0xff},
	{0x8c, 0x56, 0x4b, 0xff},
	{0xe3, 0x77, 0xc2, 0xff},
	{0x7f, 0x7f, 0x7f, 0xff},
	{0x17, 0xbe, 0xcf, 0xff},
}

// cdfChart draws, for each series, the share of samples at or below each
// latency (log scale), and saves it as a PNG.
func cdfChart(path, title, xlabel, ylabel string, order []string, samples map[string][]float64) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = ylabel
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = ticks125{}
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.Top = false
	p.Legend.Left = false
	p.Legend.XOffs = -vg.Millimeter
	p.Legend.YOffs = vg.Millimeter * 2
	p.Add(plotter.NewGrid())
	n := 0
	for i, name := range order {
		xs := slices.Clone(samples[name])
		if len(xs) == 0 {
			continue
		}
		slices.Sort(xs)
		pts := make(plotter.XYs, 0, len(xs))
		step := max(len(xs)/2000, 1) // at most ~2000 points per curve
		for j := 0; j < len(xs); j += step {
			pts = append(pts, plotter.XY{X: math.Max(xs[j], 0.01), Y: float64(j+1) / float64(len(xs))})
		}
		pts = append(pts, plotter.XY{X: math.Max(xs[len(xs)-1], 0.01), Y: 1})
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = palette[i%len(palette)]
		l.Width = vg.Points(1.5)
		if strings.HasPrefix(name, "cacheguard") {
			l.Width = vg.Points(3)
		}
		if i >= len(palette) {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
		}
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s (n=%d)", name, len(xs)), l)
		n++
	}
	if n == 0 {
		return nil
	}
	p.Legend.ThumbnailWidth = vg.Points(20)
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	return p.Save(9*vg.Inch, 5.5*vg.Inch, path)
}

// Charts writes the charts into dir and returns their paths.
func (r *Results) Charts(dir string) ([]string, error) {
	var out []string
	if t := r.Table("stampede"); t != nil {
		p := filepath.Join(dir, "stampede-latency.png")
		if err := cdfChart(p, "Stampede: request latency on a cold key (all reps pooled)", "latency (ms, log scale)", "share of requests ≤ x",
			rowOrder(t), r.StampedeLat); err != nil {
			return out, err
		}
		out = append(out, p)
	}
	if t := r.Table("contended"); t != nil {
		p := filepath.Join(dir, "contended-wait.png")
		if err := cdfChart(p, "Contended lock: wait for the lock (all reps pooled)", "wait (ms, log scale)", "share of acquisitions ≤ x",
			rowOrder(t), r.ContendedWait); err != nil {
			return out, err
		}
		out = append(out, p)
	}
	return out, nil
}

func rowOrder(t *Table) []string {
	var names []string
	for _, r := range t.Rows {
		names = append(names, r.System)
	}
	return names
}

// ticks125 marks 1, 2 and 5 times each power of ten on a log axis, labelled.
type ticks125 struct{}

func (ticks125) Ticks(lo, hi float64) []plot.Tick {
	var out []plot.Tick
	for p := math.Floor(math.Log10(lo)); math.Pow(10, p) <= hi; p++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, p)
			if v < lo || v > hi {
				continue
			}
			out = append(out, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
		}
		for m := 3.0; m < 10; m++ {
			if v := m * math.Pow(10, p); m != 5 && v >= lo && v <= hi {
				out = append(out, plot.Tick{Value: v}) // minor
			}
		}
	}
	return out
}
