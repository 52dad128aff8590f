// Hover readout of the memory timeline (brasa-profile): under the mouse, the
// last event at or before that time; its allocated and reserved bytes and each
// category's bytes go into the chart's legend. Reads the page's embedded data
// (#brasa-memory-data); the geometry constants match the Rust side
// (LEFT, RIGHT, CHART_W in memory_timeline/html.rs).
(function () {
  var data = JSON.parse(document.getElementById("brasa-memory-data").textContent);
  var L = 84, R = 24, W = 1100;
  function fmt(b) {
    var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
    while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    return (i === 0 ? b.toFixed(0) : b.toFixed(2)) + " " + u[i];
  }
  data.devices.forEach(function (dev, k) {
    var svg = document.getElementById("chart-" + k);
    var cursor = document.getElementById("cursor-" + k);
    var readout = document.getElementById("readout-" + k);
    var legend = document.getElementById("legend-" + k);
    if (!svg || !dev.points.length) return;
    var values = {};
    if (legend) {
      Array.prototype.forEach.call(legend.querySelectorAll("[data-series]"), function (el) {
        values[el.getAttribute("data-series")] = { el: el, initial: el.textContent };
      });
    }
    var initialReadout = readout.textContent;
    function show(series, text) { if (values[series]) values[series].el.textContent = text; }
    var tmax = parseFloat(svg.getAttribute("data-tmax")) || data.duration_ms || 1;
    svg.addEventListener("mousemove", function (ev) {
      var pt = svg.createSVGPoint(); pt.x = ev.clientX; pt.y = ev.clientY;
      var p = pt.matrixTransform(svg.getScreenCTM().inverse());
      if (p.x < L || p.x > W - R) return;
      var t = (p.x - L) / (W - L - R) * tmax, lo = 0, hi = dev.points.length - 1;
      cursor.setAttribute("x1", p.x); cursor.setAttribute("x2", p.x); cursor.setAttribute("visibility", "visible");
      if (t < dev.points[0][0]) { readout.textContent = "t = " + t.toFixed(3) + " ms · no event yet"; return; }
      while (lo < hi) { var mid = (lo + hi + 1) >> 1; if (dev.points[mid][0] <= t) lo = mid; else hi = mid - 1; }
      var q = dev.points[lo];
      readout.textContent = "t = " + t.toFixed(3) + " ms · allocated " + fmt(q[1]) + " · reserved " + fmt(q[2]);
      show("allocated", fmt(q[1]));
      show("reserved", fmt(q[2]));
      dev.categories.forEach(function (c, i) { show(String(i), fmt(c.bytes[lo])); });
    });
    svg.addEventListener("mouseleave", function () {
      cursor.setAttribute("visibility", "hidden");
      readout.textContent = initialReadout;
      Object.keys(values).forEach(function (key) { values[key].el.textContent = values[key].initial; });
    });
  });
})();
