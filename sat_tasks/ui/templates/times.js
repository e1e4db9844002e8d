// Times in the person's time zone and relative ("3 minutes ago"), from <time class='when' datetime=ISO>
// (macros.html `when`): data-style 'relative' shows how long ago (the local time on hover), 'full' the local time
// and how long ago, 'local' the local time (how long ago on hover). Durations of what runs (.duration.ticking[data-start]) count up; GPU- and node-hours of a
// running job ([data-hours][data-rate][data-at]) add rate x the hours since the page was made. Without script
// the server's text stays: UTC to the second.
(function () {
  var rtf = window.Intl && Intl.RelativeTimeFormat ? new Intl.RelativeTimeFormat(undefined, {numeric: 'auto'}) : null;
  var local = window.Intl && Intl.DateTimeFormat ? new Intl.DateTimeFormat(undefined, {year: 'numeric', month: 'short',
    day: 'numeric', hour: '2-digit', minute: '2-digit', second: '2-digit', timeZoneName: 'short'}) : null;
  function relative(ms) {
    var s = Math.round(ms / 1000), a = Math.abs(s);
    var units = [['year', 31536000], ['month', 2592000], ['day', 86400], ['hour', 3600], ['minute', 60]];
    for (var i = 0; i < units.length; i++) {
      if (a >= units[i][1]) { var n = Math.round(s / units[i][1]); return rtf ? rtf.format(n, units[i][0]) : n + ' ' + units[i][0] + 's'; }
    }
    return rtf ? rtf.format(s, 'second') : s + ' s';
  }
  function localTime(t) { return local ? local.format(new Date(t)) : new Date(t).toLocaleString(); }
  function pad(n) { return (n < 10 ? '0' : '') + n; }
  function duration(seconds) {
    var h = Math.floor(seconds / 3600), m = Math.floor(seconds % 3600 / 60), s = Math.floor(seconds % 60);
    return h ? h + 'h ' + pad(m) + 'm ' + pad(s) + 's' : m + 'm ' + pad(s) + 's';
  }
  function refresh() {
    var now = Date.now();
    document.querySelectorAll('time.when').forEach(function (el) {
      var t = Date.parse(el.getAttribute('datetime'));
      if (isNaN(t)) return;
      var style = el.getAttribute('data-style');
      if (style === 'full') {
        el.textContent = localTime(t) + ' (' + relative(t - now) + ')';
        el.title = el.getAttribute('datetime');
      } else if (style === 'local') {
        el.textContent = localTime(t);
        el.title = relative(t - now) + ' (' + el.getAttribute('datetime') + ')';
      } else {
        el.textContent = relative(t - now);
        el.title = localTime(t);
      }
    });
    document.querySelectorAll('.duration.ticking').forEach(function (el) {
      var t = Date.parse(el.getAttribute('data-start'));
      if (!isNaN(t)) { el.textContent = duration(Math.max(0, (now - t) / 1000)); }
    });
    document.querySelectorAll('[data-hours][data-rate][data-at]').forEach(function (el) {
      var at = Date.parse(el.getAttribute('data-at')), hours = parseFloat(el.getAttribute('data-hours'));
      var rate = parseFloat(el.getAttribute('data-rate'));
      if (!isNaN(at) && !isNaN(hours) && !isNaN(rate)) {
        el.textContent = (hours + rate * Math.max(0, now - at) / 3600000).toFixed(2);
      }
    });
  }
  window.satTimes = {refresh: refresh};
  refresh();
  setInterval(refresh, 1000);
})();
