// The eval report's behaviour: per-episode plots as inline SVG from the page's embedded JSON, a
// cursor in them that follows the episode's video, and the filters and sorting of the cards.
// Plain browser JavaScript with no dependencies, so the page works offline and from file://.
(function () {
  "use strict";

  var SVG = "http://www.w3.org/2000/svg";
  var WIDTH = 260;
  var HEIGHT = 96;
  var MARGIN = { left: 40, right: 6, top: 6, bottom: 16 };

  function svgElement(name, attributes) {
    var element = document.createElementNS(SVG, name);
    Object.keys(attributes).forEach(function (key) {
      element.setAttribute(key, String(attributes[key]));
    });
    return element;
  }

  function finite(values) {
    return values.filter(function (v) {
      return typeof v === "number" && isFinite(v);
    });
  }

  // An axis label: enough significant digits that it is off by at most half a percent of the axis's span (a
  // pixel), so it reads as where the line is (101 on an axis from 100.5 to 101.5 read as 102 with three digits).
  function format(value, span) {
    if (value === 0) return "0";
    var magnitude = Math.abs(value);
    var digits = Math.min(Math.max(Math.ceil(Math.log10(magnitude / span)) + 3, 3), 12);
    if (magnitude >= 1e6 || magnitude < 1e-3) return value.toExponential(digits - 1).replace(/\.?0+e/, "e");
    return String(Number(value.toPrecision(digits)));
  }

  // The x scale of an episode: from its first to its last sampled step.
  function stepScale(steps) {
    var first = steps.length ? steps[0] : 0;
    var last = steps.length ? steps[steps.length - 1] : 1;
    var span = last > first ? last - first : 1;
    return function (step) {
      var clamped = Math.min(Math.max(step, first), last);
      return MARGIN.left + ((clamped - first) / span) * (WIDTH - MARGIN.left - MARGIN.right);
    };
  }

  // The line of one series as path data; a null value (not finite in the trace) leaves a gap.
  function pathData(steps, values, x, y) {
    var parts = [];
    var pen = "M";
    for (var i = 0; i < steps.length; i++) {
      if (typeof values[i] !== "number") {
        pen = "M";
        continue;
      }
      parts.push(pen + x(steps[i]).toFixed(1) + " " + y(values[i]).toFixed(1));
      pen = "L";
    }
    return parts.join(" ");
  }

  // Samples with no neighbour to join (a one-step episode, a value between gaps): drawn as dots.
  function isolated(values) {
    var found = [];
    values.forEach(function (value, i) {
      var joined = typeof values[i - 1] === "number" || typeof values[i + 1] === "number";
      if (typeof value === "number" && !joined) found.push(i);
    });
    return found;
  }

  function plot(steps, series, x) {
    var known = finite(series.values);
    var low = known.length ? Math.min.apply(null, known) : 0;
    var high = known.length ? Math.max.apply(null, known) : 1;
    if (high - low <= 1e-9 * Math.max(Math.abs(high), Math.abs(low))) {  // constant, or float noise around one value
      var pad = Math.abs(high) < 100 ? 0.5 : Math.pow(10, Math.floor(Math.log10(Math.abs(high))) - 2);
      high += pad;
      low -= pad;
    }
    var y = function (value) {
      return MARGIN.top + ((high - value) / (high - low)) * (HEIGHT - MARGIN.top - MARGIN.bottom);
    };
    var figure = document.createElement("figure");
    figure.className = "plot " + series.group;
    var caption = document.createElement("figcaption");
    caption.textContent = series.group === "state" ? series.feature + " · " + series.name : series.name;
    caption.title = series.group + " " + series.feature + " " + series.name;
    var svg = svgElement("svg", { viewBox: "0 0 " + WIDTH + " " + HEIGHT, role: "img" });
    svg.setAttribute("aria-label", caption.title);
    var bottom = HEIGHT - MARGIN.bottom;
    svg.appendChild(svgElement("rect", { class: "frame", x: MARGIN.left, y: MARGIN.top, width: WIDTH - MARGIN.left - MARGIN.right, height: bottom - MARGIN.top }));
    [
      [high, MARGIN.top + 8],
      [low, bottom],
    ].forEach(function (tick) {
      var label = svgElement("text", { class: "tick", x: MARGIN.left - 3, y: tick[1], "text-anchor": "end" });
      label.textContent = format(tick[0], high - low);
      svg.appendChild(label);
    });
    if (steps.length) {
      var ends = [[steps[0], "start"]];
      if (steps.length > 1) ends.push([steps[steps.length - 1], "end"]);
      ends.forEach(function (tick) {
        var label = svgElement("text", { class: "tick", x: x(tick[0]), y: HEIGHT - 3, "text-anchor": tick[1] });
        label.textContent = "step " + tick[0];
        svg.appendChild(label);
      });
    }
    svg.appendChild(svgElement("path", { class: "line", d: pathData(steps, series.values, x, y) }));
    isolated(series.values).forEach(function (i) {
      svg.appendChild(svgElement("circle", { class: "point", cx: x(steps[i]).toFixed(1), cy: y(series.values[i]).toFixed(1), r: 2 }));
    });
    svg.appendChild(svgElement("line", { class: "cursor", x1: MARGIN.left, x2: MARGIN.left, y1: MARGIN.top, y2: bottom }));
    figure.appendChild(caption);
    figure.appendChild(svg);
    return figure;
  }

  // Every cursor of a card to the step the video shows (frame k of a video is step k of the trace).
  function follow(card, episode, x) {
    var cursors = card.querySelectorAll(".plots line.cursor");
    var plots = card.querySelector(".plots");
    function moveTo(step) {
      var position = x(step).toFixed(1);
      plots.setAttribute("data-step", String(Math.floor(step)));
      cursors.forEach(function (cursor) {
        cursor.setAttribute("x1", position);
        cursor.setAttribute("x2", position);
      });
    }
    card.querySelectorAll("video").forEach(function (video) {
      var frame = null;
      function update() {
        moveTo(video.currentTime * episode.rate);
      }
      function tick() {
        update();
        frame = video.paused || video.ended ? null : window.requestAnimationFrame(tick);
      }
      ["timeupdate", "seeked", "loadedmetadata"].forEach(function (name) {
        video.addEventListener(name, update);
      });
      video.addEventListener("play", function () {
        if (frame === null) frame = window.requestAnimationFrame(tick);
      });
    });
  }

  function drawPlots(data) {
    document.querySelectorAll("article.episode").forEach(function (card) {
      var episode = data[card.getAttribute("data-index")];
      var holder = card.querySelector(".plots");
      if (!episode || !holder) return;
      var x = stepScale(episode.steps);
      episode.series.forEach(function (series) {
        holder.appendChild(plot(episode.steps, series, x));
      });
      follow(card, episode, x);
    });
  }

  function sortKey(card, field) {
    var text = card.getAttribute("data-" + field);
    return text === null || text === "" ? null : Number(text);
  }

  // Cards with no value (errored episodes have no score) go last whichever way the sort runs.
  function sortCards(container, order) {
    var cards = Array.prototype.slice.call(container.querySelectorAll("article.episode"));
    var field = order ? order.split("-")[0] : "index";
    var descending = order.endsWith("-desc");
    cards.sort(function (a, b) {
      var left = sortKey(a, field);
      var right = sortKey(b, field);
      if (left === null || right === null) {
        return left === right ? sortKey(a, "index") - sortKey(b, "index") : left === null ? 1 : -1;
      }
      return (descending ? right - left : left - right) || sortKey(a, "index") - sortKey(b, "index");
    });
    cards.forEach(function (card) {
      container.appendChild(card);
    });
  }

  function wireControls() {
    var form = document.getElementById("controls");
    var container = document.getElementById("cards");
    if (!form || !container) return;
    function apply() {
      var statuses = {};
      form.querySelectorAll('input[name="status"]').forEach(function (box) {
        statuses[box.value] = box.checked;
      });
      var task = form.elements.namedItem("task").value;
      var checkpointSelect = form.elements.namedItem("checkpoint");
      var checkpoint = checkpointSelect ? checkpointSelect.value : "";
      var seed = form.elements.namedItem("seed").value.trim();
      var differsBox = form.elements.namedItem("differs");
      var differs = differsBox ? differsBox.checked : false;
      var cards = container.querySelectorAll("article.episode");
      var shown = 0;
      cards.forEach(function (card) {
        var visible =
          statuses[card.getAttribute("data-status")] === true &&
          (!task || card.getAttribute("data-task") === task) &&
          (!checkpoint || card.getAttribute("data-checkpoint") === checkpoint) &&
          (!seed || card.getAttribute("data-seed") === seed) &&
          (!differs || card.getAttribute("data-differs") === "1");
        card.hidden = !visible;
        shown += visible ? 1 : 0;
      });
      document.getElementById("shown").textContent = shown + " of " + cards.length + " episodes";
      sortCards(container, form.elements.namedItem("sort").value);
    }
    form.addEventListener("change", apply);
    form.addEventListener("input", apply); // the seed, as it is typed
    apply();
  }

  // Each card's episode in the published dataset, from report_files/dataset.js (null until the
  // dataset step published one): its index, a link to the dataset and the command that shows it.
  function linkDataset(published) {
    // one dataset, or a sweep's list of them (one per checkpoint): each card links to the one holding its episode
    var datasets = Array.isArray(published) ? published : published ? [published] : [];
    document.querySelectorAll("p.dataset[data-trace]").forEach(function (slot) {
      var trace = slot.getAttribute("data-trace");
      var dataset = datasets.find(function (candidate) {
        return candidate.episodes && typeof candidate.episodes[trace] === "number";
      });
      if (!dataset) return;
      var index = dataset.episodes[trace];
      var link = document.createElement("a");
      link.href = dataset.href + "/";
      link.textContent = "dataset episode " + index;
      link.title =
        "lerobot-dataset-viz --repo-id " + dataset.repo_id + " --root " + dataset.root + " --episode-index " + index;
      slot.appendChild(link);
      slot.appendChild(document.createTextNode(" of " + dataset.repo_id));
      slot.hidden = false;
    });
  }

  var source = document.getElementById("episode-data");
  drawPlots(source ? JSON.parse(source.textContent) : {});
  linkDataset(window.HUD_DATASET);
  wireControls();
})();
