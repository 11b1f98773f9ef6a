package bench

import (
	"fmt"
	"image/color"
	"math"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// defenceColors keep each defence's colour the same in both panels.
var defenceColors = map[string]color.Color{
	"kernel":   color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	"nftables": color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	"moat":     color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
}

// plotLegit draws the legit comparison as two stacked panels sharing the
// attack-strength axis: share of requests answered, and p99 latency (log
// scale, as it spans from a fraction of a millisecond to the timeout).
// Colour is the defence; solid lines are clients on the attacked link,
// dashed ones clients on their own link.
func plotLegit(l *LegitResult, path string) error {
	success := plot.New()
	success.Title.Text = "Legitimate HTTP requests during a spoofed SYN flood"
	success.Y.Label.Text = "requests answered within 1 s (%)"
	success.Y.Min, success.Y.Max = 0, 105
	latency := plot.New()
	latency.Y.Label.Text = "p99 latency of answered requests (ms)"
	latency.Y.Scale = plot.LogScale{}
	latency.Y.Tick.Marker = logTicks{}
	for _, p := range []*plot.Plot{success, latency} {
		p.X.Label.Text = "flood offered (% of the generator's maximum)"
		p.X.Min, p.X.Max = 0, 100
		p.Add(plotter.NewGrid())
	}
	success.Legend.Left = true
	success.Legend.Top = false

	for _, pl := range l.Placements {
		for _, d := range l.Defences {
			var ok, p99 plotter.XYs
			for _, pt := range l.Points {
				if pt.Defence != d || pt.Placement != pl {
					continue
				}
				x := 100 * pt.Fraction
				if !math.IsNaN(pt.Success.Median) {
					ok = append(ok, plotter.XY{X: x, Y: 100 * pt.Success.Median})
				}
				if v := pt.P99ms.Median; !math.IsNaN(v) && v > 0 {
					p99 = append(p99, plotter.XY{X: x, Y: v})
				}
			}
			c := defenceColors[d]
			if c == nil {
				c = color.Black
			}
			for i, s := range []struct {
				p   *plot.Plot
				xys plotter.XYs
			}{{success, ok}, {latency, p99}} {
				if len(s.xys) == 0 {
					continue
				}
				line, points, err := plotter.NewLinePoints(s.xys)
				if err != nil {
					return err
				}
				line.Color, points.Color = c, c
				line.Width = vg.Points(1.5)
				if pl != placeSharedLink {
					line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
				}
				s.p.Add(line, points)
				if i == 0 {
					s.p.Legend.Add(fmt.Sprintf("%s, clients on the %s", d, pl), line, points)
				}
			}
		}
	}

	const w, h = 18 * vg.Centimeter, 20 * vg.Centimeter
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2,
		PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4, PadY: vg.Millimeter * 6}
	plots := [][]*plot.Plot{{success}, {latency}}
	canvases := plot.Align(plots, tiles, dc)
	success.Draw(canvases[0][0])
	latency.Draw(canvases[1][0])

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// logTicks labels 1, 2 and 5 times each power of ten, which LogTicks does
// not, so that a panel spanning less than a decade still has labels.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi; e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v < lo || v > hi {
				continue
			}
			ts = append(ts, plot.Tick{Value: v, Label: strconvG(v)})
		}
	}
	return ts
}

func strconvG(v float64) string { return fmt.Sprintf("%g", v) }
