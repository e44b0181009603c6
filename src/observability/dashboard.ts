// The operators' dashboard: one self-contained HTML page (no external assets) that polls
// /dashboard/data and draws per-replica tables and 15-minute SVG charts. Pure: strings only.

export const LOGIN_PAGE = `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>prefix-router · sign in</title>
<meta name="viewport" content="width=device-width,initial-scale=1">
<style>body{font:15px system-ui,sans-serif;background:#f6f7f9;display:grid;place-items:center;height:100vh;margin:0}
form{background:#fff;padding:24px 28px;border-radius:8px;box-shadow:0 1px 4px #0002;min-width:320px}
input{width:100%;padding:8px;margin:8px 0 12px;box-sizing:border-box;font:inherit}button{padding:8px 16px;font:inherit}
.err{color:#b00020}</style></head><body><form method="post" action="/dashboard/login">
<h2>prefix-router</h2><label for="token">Admin token</label><input id="token" name="token" type="password" autocomplete="current-password" required>
<!--ERROR--><button type="submit">Open dashboard</button></form></body></html>`;

export const DASHBOARD_PAGE = `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>prefix-router</title>
<meta name="viewport" content="width=device-width,initial-scale=1">
<style>
body{font:14px system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1c1e21}
header{background:#1f2937;color:#fff;padding:10px 20px;display:flex;gap:16px;align-items:baseline}
header h1{font-size:18px;margin:0}.logout{margin-left:auto}#updated{opacity:.7;font-size:12px}
main{padding:12px 20px;max-width:1400px}
.alerts{margin:8px 0}.alert{background:#fdecea;border-left:4px solid #d93025;padding:6px 10px;margin:4px 0}
.ok{background:#e6f4ea;border-left:4px solid #1e8e3e;padding:6px 10px}
section.pool{background:#fff;border-radius:8px;box-shadow:0 1px 3px #0001;margin:14px 0;padding:10px 16px}
section.pool h2{font-size:16px;margin:4px 0 8px}.meta{color:#555;font-size:12px;font-weight:normal}
table{border-collapse:collapse;width:100%}th,td{text-align:right;padding:4px 8px;border-bottom:1px solid #eee;font-variant-numeric:tabular-nums}
th:first-child,td:first-child{text-align:left}th{font-size:12px;color:#555;font-weight:600}
.down{color:#b00020;font-weight:600}.up{color:#1e8e3e}.drain{color:#b06000}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(300px,1fr));gap:10px;margin-top:10px}
.chart h3{font-size:12px;margin:0 0 2px;color:#444}.chart svg{width:100%;height:120px;background:#fafbfc;border:1px solid #eee}
.legend span{display:inline-block;margin-right:10px;font-size:11px}.legend i{display:inline-block;width:10px;height:3px;margin-right:3px;vertical-align:middle}
</style></head><body>
<header><h1>prefix-router</h1><span id="updated">loading…</span><form method="post" action="/dashboard/logout" class="logout"><button type="submit">Log out</button></form></header>
<main><div class="alerts" id="alerts"></div><section class="pool" id="tenants-section"><h2>Tenants <span class="meta">top by tokens · limit use now · prefix-cache hit rate</span></h2><div id="tenants"></div></section><div id="pools"></div></main>
<script nonce="NONCE">
const COLORS=['#1a73e8','#d93025','#1e8e3e','#f9ab00','#9334e6','#12b5cb','#e8710a','#5f6368'];
const pct=v=>v==null?'–':(v*100).toFixed(1)+'%';
const ms=v=>v==null?'–':(v*1000).toFixed(0)+' ms';
const num=v=>v==null?'–':String(Math.round(v*100)/100);
const esc=s=>String(s).replace(/[&<>"']/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c]));
function chart(title,samples,ids,get,fmt,fixedMax){
  const W=300,H=110,P=4;const t0=Date.now()-15*60*1000;let max=fixedMax||0;
  const series=ids.map(id=>samples.map(s=>[s.at,get(s.replicas[id]||{})]).filter(p=>p[1]!=null));
  if(!fixedMax)for(const s of series)for(const p of s)max=Math.max(max,p[1]);if(max<=0)max=1;
  const x=t=>P+(W-2*P)*Math.max(0,(t-t0))/(15*60*1000),y=v=>H-P-(H-2*P)*v/max;
  const lines=series.map((s,i)=>s.length===1?'<circle r="2" fill="'+COLORS[i%COLORS.length]+'" cx="'+x(s[0][0]).toFixed(1)+'" cy="'+y(s[0][1]).toFixed(1)+'"/>':s.length?'<polyline fill="none" stroke-width="1.5" stroke="'+COLORS[i%COLORS.length]+'" points="'+s.map(p=>x(p[0]).toFixed(1)+','+y(p[1]).toFixed(1)).join(' ')+'"/>':'').join('');
  const legend=ids.map((id,i)=>'<span><i style="background:'+COLORS[i%COLORS.length]+'"></i>'+esc(id)+'</span>').join('');
  return '<div class="chart"><h3>'+esc(title)+' <span class="meta">(max '+fmt(max)+')</span></h3><svg viewBox="0 0 '+W+' '+H+'" preserveAspectRatio="none" role="img" aria-label="'+esc(title)+'">'+lines+'</svg><div class="legend">'+legend+'</div></div>';
}
function bar(v){if(v==null)return '–';const w=Math.round(Math.min(1,v)*60);const c=v>=0.9?'#d93025':v>=0.7?'#f9ab00':'#1e8e3e';
  return '<svg width="62" height="10" role="img" aria-label="'+pct(v)+'"><rect width="62" height="10" fill="#eee"/><rect width="'+w+'" height="10" fill="'+c+'"/></svg> '+pct(v);}
const big=v=>v>=1e6?(v/1e6).toFixed(2)+'M':v>=1e4?(v/1e3).toFixed(1)+'k':String(v);
function renderTenants(ts){
  const el=document.getElementById('tenants');
  if(!ts||!ts.length){el.innerHTML='<div class="meta">No tenant usage reported yet.</div>';return;}
  el.innerHTML='<table><thead><tr><th>tenant</th><th>tokens</th><th>prompt</th><th>completion</th><th>requests</th><th title="cached / prompt tokens over the requests whose engine reported cached tokens">hit rate</th><th title="requests whose usage had no cached-token figure">no cache report</th><th>requests/min use</th><th>tokens/min use</th><th>429s</th></tr></thead><tbody>'+
    ts.map(t=>'<tr data-tenant="'+esc(t.tenant)+'"><td>'+esc(t.tenant)+'</td><td data-field="tokens">'+big(t.totalTokens)+'</td><td>'+big(t.promptTokens)+'</td><td>'+big(t.completionTokens)+'</td><td data-field="requests">'+t.requests+'</td><td data-field="hit">'+pct(t.hitRate)+'</td><td data-field="no_cache_report">'+(t.requestsWithoutCacheReport||0)+'</td><td data-field="rpm_use">'+bar(t.requestsUse)+(t.requestsPerMinute?' <span class="meta">of '+t.requestsPerMinute+'</span>':'')+'</td><td data-field="tpm_use">'+bar(t.tokensUse)+(t.tokensPerMinute?' <span class="meta">of '+big(t.tokensPerMinute)+'</span>':'')+'</td><td data-field="limited">'+t.rateLimited+'</td></tr>').join('')+'</tbody></table>';
}
// Flow control (coordinator/queue.ts): what waits per band, the drain rate, the refusals, the tenants waiting most.
function queueLine(q){if(!q)return '';
  const rej=Object.entries(q.rejected).reduce((a,[k,n])=>a+n,0);
  return '<div class="meta" data-queue>queue (bound '+q.boundPerReplica+'/replica): '+Object.entries(q.depth).map(([b,n])=>'<span data-band="'+esc(b)+'">'+esc(b)+' '+n+'</span>').join(' · ')+' · drain '+num(q.drainPerSecond)+'/s · refused '+rej+(q.shareReserve>0?' · held by the share reserve ('+q.shareReserve+') '+q.reserveHeld:'')+(q.preempt?' · preempted '+q.preempted:'')+(q.tenants.length?' · waiting most: '+q.tenants.slice(0,5).map(t=>esc(t.tenant)+' '+t.queued+' (oldest '+num(t.oldestWaitMs/1000)+' s)').join(', '):'')+'</div>';}
function render(d){
  renderTenants(d.tenants);
  const alerts=d.pools.flatMap(p=>p.alerts.map(a=>a.kind==='queue_imbalance'
    ?'Pool '+esc(p.pool)+': replica <b>'+esc(a.replica)+'</b> queue '+a.waiting+' above '+num(a.threshold)+' (median '+num(a.median)+')'
    :'Pool '+esc(p.pool)+': hot '+esc(a.keyKind)+' key <b>'+esc(a.keyHash)+'</b> carries '+pct(a.share)+' of requests'));
  // Lease protocol v2: a pool whose coordinator is unreachable is routed open (consistent hash, no load bound across isolates).
  const why={coordinator_unreachable:'its coordinator does not answer',isolate_breaker:'its coordinator failed moments ago',recent_fallbacks:'requests were routed without its coordinator in the last minute'};
  for(const o of (d.open||[]))alerts.unshift('<span data-open="'+esc(o.pool)+'">Pool <b>'+esc(o.pool)+'</b> is running open: '+esc(why[o.reason]||o.reason)+' ('+big(o.fallbacks)+' requests routed open so far)</span>');
  document.getElementById('alerts').innerHTML=alerts.length?alerts.map(a=>'<div class="alert" data-alert>'+a+'</div>').join(''):'<div class="ok">No active alerts</div>';
  document.getElementById('pools').innerHTML=d.pools.map(p=>{
    const last=p.samples[p.samples.length-1];const ids=p.replicas.map(r=>r.id);
    const rows=p.replicas.map(r=>{const s=r.stats;const hit=s.cacheReportedPromptTokens>0?s.cachedTokens/s.cacheReportedPromptTokens:null;const q=r.ttft;
      const state=r.draining?'<span class="drain">draining</span>':r.healthy?'<span class="up">up</span>':'<span class="down">down</span>';
      const rps=last&&last.replicas[r.id]?last.replicas[r.id].requests/10:null;
      return '<tr data-replica="'+esc(r.id)+'"><td>'+esc(r.id)+'</td><td>'+state+'</td><td data-field="router_hit">'+pct(hit)+'</td><td data-field="no_cache_report">'+(s.requestsWithoutCacheReport||0)+'</td><td data-field="vllm_hit">'+pct(r.vllm.hitRate)+'</td><td data-field="waiting">'+num(r.vllm.waiting)+'</td><td data-field="in_flight">'+r.inFlight+'</td><td data-field="ttft_p50">'+ms(q.p50)+'</td><td data-field="ttft_p95">'+ms(q.p95)+'</td><td data-field="rps">'+num(rps)+'</td><td data-field="requests">'+s.requests+'</td><td>'+r.weight+'</td></tr>';}).join('');
    return '<section class="pool" data-pool="'+esc(p.pool)+'"><h2>'+esc(p.pool)+' <span class="meta">'+esc(p.strategy)+' · keys '+esc(p.keys.join(', '))+' · '+p.leases+' in flight · expired leases '+p.expiredLeases+'</span></h2>'+queueLine(p.queue)+
      '<table><thead><tr><th>replica</th><th>health</th><th title="cached / prompt tokens over the requests whose engine reported cached tokens">hit rate (router)</th><th title="requests whose usage had no cached-token figure (engine flags: docs/operations.md), left out of the router hit rate">no cache report</th><th>hit rate (engine)</th><th>waiting</th><th>in flight</th><th>TTFT p50</th><th>TTFT p95</th><th>req/s</th><th>requests</th><th>weight</th></tr></thead><tbody>'+rows+'</tbody></table>'+
      '<div class="charts">'+chart('prefix-cache hit rate (router)',p.samples,ids,r=>r.routerHitRate,pct,1)+chart('waiting (vLLM)',p.samples,ids,r=>r.waiting,num)+chart('in flight',p.samples,ids,r=>r.inFlight,num)+chart('TTFT p95',p.samples,ids,r=>r.ttftP95,ms)+chart('requests / s',p.samples,ids,r=>r.requests==null?null:r.requests/10,num)+'</div></section>';
  }).join('');
  document.getElementById('updated').textContent='updated '+new Date(d.at).toLocaleTimeString();
  document.body.dataset.updates=String((Number(document.body.dataset.updates)||0)+1);
}
async function tick(){
  try{const r=await fetch('/dashboard/data',{credentials:'same-origin',cache:'no-store'});
    if(r.status===401){location.href='/dashboard';return;}
    render(await r.json());}catch(e){document.getElementById('updated').textContent='update failed: '+e.message;}
}
tick();setInterval(tick,REFRESH_MS);
</script></body></html>`;

/** The page with its refresh interval and the script nonce its CSP allows (ops.ts). */
export function dashboardPage(refreshMs: number, nonce: string): string {
  return DASHBOARD_PAGE.replace('REFRESH_MS', String(Math.max(500, Math.floor(refreshMs)))).replace('NONCE', nonce);
}
