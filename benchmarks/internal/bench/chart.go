package bench

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
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

// glyphs mark the points of sweep lines, so that systems whose lines
// coincide (equal load counts) stay told apart.
var glyphs = []draw.GlyphDrawer{
	draw.CircleGlyph{}, draw.BoxGlyph{}, draw.TriangleGlyph{}, draw.RingGlyph{},
	draw.SquareGlyph{}, draw.PyramidGlyph{}, draw.CrossGlyph{}, draw.PlusGlyph{},
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
	out, err := r.pgCharts(dir)
	if err != nil {
		return out, err
	}
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
	sweeps, err := r.sweepCharts(dir)
	return append(out, sweeps...), err
}

// pgCharts writes the charts of the real-database scenarios into dir and
// returns their paths.
func (r *Results) pgCharts(dir string) ([]string, error) {
	var out []string
	if t := r.Table("pg-mix"); t != nil && len(r.PGSeries) > 0 {
		p := filepath.Join(dir, "pg-mix-timeline.png")
		ok, err := timelineChart(p, rowOrder(t), r.PGSeries, r.s.pgMixRate)
		if err != nil {
			return out, err
		}
		if ok {
			out = append(out, p)
		}
	}
	if t := r.Table("pg-stampede"); t != nil && len(r.PGStampedeLat) > 0 {
		p := filepath.Join(dir, "pg-stampede-latency.png")
		if err := cdfChart(p, "Stampede on PostgreSQL: request latency on a cold key (all reps pooled; a failed request at its deadline)",
			"latency (ms, log scale)", "share of requests ≤ x", rowOrder(t), r.PGStampedeLat); err != nil {
			return out, err
		}
		out = append(out, p)
	}
	return out, nil
}

// timelineChart draws the real-database mix over time, one line per system:
// requests completed per second, requests failed per second and queries sent
// to PostgreSQL per second, in three panels one above the other, and saves it
// as a PNG. It reports whether it wrote the chart.
func timelineChart(path string, order []string, series map[string]*Series, offered float64) (bool, error) {
	panels := []struct {
		title, ylabel string
		of            func(*Series) []int
	}{
		{"Requests completed (last repetition)", "completed / s", func(s *Series) []int { return s.Done }},
		{"Requests failed", "failed / s", func(s *Series) []int { return s.Failed }},
		{"Queries sent to PostgreSQL", "queries / s", func(s *Series) []int { return s.Qry }},
	}
	plots := make([][]*plot.Plot, len(panels))
	n := 0
	for pi, pn := range panels {
		p := plot.New()
		p.Title.Text = pn.title
		p.X.Label.Text = "time since the start of the run (s)"
		p.Y.Label.Text = pn.ylabel
		p.Y.Min = 0
		p.X.Tick.Marker, p.Y.Tick.Marker = plainTicks{}, plainTicks{}
		p.Legend.Top = true
		p.Legend.Left = false
		p.Legend.ThumbnailWidth = vg.Points(20)
		p.Legend.TextStyle.Font.Size = vg.Points(8)
		p.Add(plotter.NewGrid())
		for i, name := range order {
			s := series[name]
			if s == nil {
				continue
			}
			ys := pn.of(s)
			pts := make(plotter.XYs, len(ys))
			for j, c := range ys {
				pts[j] = plotter.XY{X: (float64(j) + 0.5) * s.Bucket.Seconds(), Y: float64(c) / s.Bucket.Seconds()}
			}
			l, err := plotter.NewLine(pts)
			if err != nil {
				return false, err
			}
			l.Color = palette[i%len(palette)]
			l.Width = vg.Points(1.5)
			if strings.HasPrefix(name, "cacheguard") {
				l.Width = vg.Points(3)
			}
			p.Add(l)
			if pi == 0 {
				p.Legend.Add(name, l)
				n++
			}
		}
		if pi == 0 && offered > 0 {
			l, err := plotter.NewLine(plotter.XYs{{X: p.X.Min, Y: offered}, {X: p.X.Max, Y: offered}})
			if err != nil {
				return false, err
			}
			l.Color = color.RGBA{0x7f, 0x7f, 0x7f, 0xff}
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
			p.Add(l)
			p.Legend.Add(fmt.Sprintf("offered at full rate (%g/s)", offered), l)
			p.Y.Max *= 1.6 // room for the legend
		}
		plots[pi] = []*plot.Plot{p}
	}
	if n == 0 {
		return false, nil
	}
	img := vgimg.NewWith(vgimg.UseWH(10*vg.Inch, 12*vg.Inch), vgimg.UseBackgroundColor(color.White))
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadY: 4 * vg.Millimeter,
		PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 2 * vg.Millimeter}
	cs := plot.Align(plots, tiles, draw.New(img))
	for i := range plots {
		plots[i][0].Draw(cs[i][0])
	}
	f, err := os.Create(path)
	if err != nil {
		return false, err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return false, err
	}
	return true, f.Close()
}

// sweepCharts writes the charts of the scale sweeps into dir and returns
// their paths.
func (r *Results) sweepCharts(dir string) ([]string, error) {
	var out []string
	floor := r.s.load.Seconds() * 1000
	for _, c := range []struct{ id, file, title, xlabel string }{
		{"scale-procs", "scale-processes.png", "Scale with processes", fmt.Sprintf("processes (%d concurrent requests each, log scale)", r.s.scaleG)},
		{"scale-total", "scale-requests.png", "Scale with concurrent requests", fmt.Sprintf("concurrent requests over %d processes (log scale)", r.s.scaleFixedP)},
	} {
		loads, p99 := r.Table(c.id+"-loads"), r.Table(c.id+"-p99")
		if loads == nil || p99 == nil {
			continue
		}
		p := filepath.Join(dir, c.file)
		ok, err := sweepChart(p, c.title, c.xlabel, loads, p99, floor)
		if err != nil {
			return out, err
		}
		if ok {
			out = append(out, p)
		}
	}
	return out, nil
}

// sweepChart draws a scale sweep as two panels side by side, loads (log
// scale) and p99 latency, with one line per system through the medians and
// the min–max over repetitions as error bars, and saves it as a PNG. floor is
// the loader's own time in ms, which no request on a cold key can beat. It
// reports whether it wrote the chart: both tables need a system with data.
func sweepChart(path, title, xlabel string, loads, p99 *Table, floor float64) (bool, error) {
	pl, nl, err := sweepPanel(title+": loads per burst", xlabel, "loads (log scale)", loads, true)
	if err != nil {
		return false, err
	}
	pp, np, err := sweepPanel(title+": p99 latency", xlabel, "p99 latency (ms)", p99, false)
	if err != nil || nl == 0 || np == 0 {
		return false, err
	}
	l, err := plotter.NewLine(plotter.XYs{{X: pp.X.Min, Y: floor}, {X: pp.X.Max, Y: floor}})
	if err != nil {
		return false, err
	}
	l.Color = color.RGBA{0x7f, 0x7f, 0x7f, 0xff}
	l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
	pp.Add(l)
	pp.Legend.Add(fmt.Sprintf("the load alone (%g ms)", floor), l)
	pp.Y.Min = 0
	pp.Y.Max *= 1.15 // room for the legend

	img := vgimg.NewWith(vgimg.UseWH(12*vg.Inch, 5*vg.Inch), vgimg.UseBackgroundColor(color.White))
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: 6 * vg.Millimeter,
		PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 2 * vg.Millimeter}
	cs := plot.Align([][]*plot.Plot{{pl, pp}}, tiles, draw.New(img))
	pl.Draw(cs[0][0])
	pp.Draw(cs[0][1])
	f, err := os.Create(path)
	if err != nil {
		return false, err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return false, err
	}
	return true, f.Close()
}

// sweepPanel plots one table of a sweep against its X values (log scale),
// with a legend, and returns it with the number of systems drawn.
func sweepPanel(title, xlabel, ylabel string, t *Table, logY bool) (*plot.Plot, int, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = ylabel
	p.X.Scale = plot.LogScale{}
	var ticks []plot.Tick
	for _, x := range t.X {
		ticks = append(ticks, plot.Tick{Value: x, Label: strconv.FormatFloat(x, 'g', -1, 64)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	if logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = ticks125{}
	}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Millimeter * 2
	p.Legend.YOffs = -vg.Millimeter
	p.Legend.ThumbnailWidth = vg.Points(20)
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.Legend.Padding = vg.Points(2) // the glyphs are taller than the text
	p.Add(plotter.NewGrid())
	n := 0
	for i, row := range t.Rows {
		// Nudge each system a little sideways so that coinciding points and
		// bars stay visible; the ticks mark the true values.
		dodge := math.Pow(1.04, float64(i)-float64(len(t.Rows)-1)/2)
		var pts spread
		for j, m := range t.Metrics {
			s, ok := row.Summary(m.Key)
			if row.Skip != "" || !ok || j >= len(t.X) || logY && s.Min <= 0 {
				continue
			}
			pts.XYs = append(pts.XYs, plotter.XY{X: t.X[j] * dodge, Y: s.Median})
			pts.lo = append(pts.lo, s.Min)
			pts.hi = append(pts.hi, s.Max)
		}
		if len(pts.XYs) == 0 {
			continue
		}
		l, sc, err := plotter.NewLinePoints(pts.XYs)
		if err != nil {
			return nil, 0, err
		}
		eb, err := plotter.NewYErrorBars(pts)
		if err != nil {
			return nil, 0, err
		}
		c := palette[i%len(palette)]
		l.Color, sc.Color, eb.Color = c, c, c
		l.Width = vg.Points(1.5)
		if strings.HasPrefix(row.System, "cacheguard") {
			l.Width = vg.Points(3)
		}
		sc.Shape = glyphs[i%len(glyphs)]
		sc.Radius = vg.Points(4)
		p.Add(l, sc, eb)
		p.Legend.Add(row.System, l, sc)
		n++
	}
	// Pad the log axes so that the end points and their bars sit inside.
	p.X.Min, p.X.Max = p.X.Min/1.3, p.X.Max*1.3
	if logY {
		p.Y.Min, p.Y.Max = p.Y.Min/1.5, p.Y.Max*3 // room above for the legend
	}
	return p, n, nil
}

// spread is a line's points with the min and max of each, as error bars.
type spread struct {
	plotter.XYs
	lo, hi []float64
}

func (s spread) YError(i int) (float64, float64) { return s.XYs[i].Y - s.lo[i], s.hi[i] - s.XYs[i].Y }

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

// plainTicks are gonum's default ticks labelled without trailing zeros.
type plainTicks struct{}

func (plainTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = strconv.FormatFloat(ts[i].Value, 'f', -1, 64)
		}
	}
	return ts
}
